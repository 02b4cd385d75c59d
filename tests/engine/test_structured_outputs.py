"""Offline structured outputs on the default model: every constrained output follows its schema, regex or choice."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from jido import LLM, SamplingParams, StructuredOutputsParams

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "country": {"type": "string", "enum": ["France", "Germany", "Japan"]},
        "capital": {"type": "boolean"},
        "rank": {"type": "integer", "minimum": 1, "maximum": 99},
    },
    "required": ["city", "country", "capital", "rank"],
    "additionalProperties": False,
}
PROMPTS = ["The largest city of France, as JSON:", "Describe Tokyo in JSON:", "A city record:"]


def _constrained(**kwargs) -> StructuredOutputsParams:
    return StructuredOutputsParams(**kwargs)


def test_greedy_and_seeded_outputs_validate_against_the_json_schema_and_end_there(llm):
    params = [SamplingParams(temperature=0, max_tokens=80, structured_outputs=_constrained(json=SCHEMA)),
              SamplingParams(temperature=0.8, seed=1, max_tokens=80, structured_outputs=_constrained(json=SCHEMA)),
              SamplingParams(temperature=1.0, seed=2, max_tokens=80, structured_outputs=_constrained(json=SCHEMA))]
    for output in llm.generate(PROMPTS, params, use_tqdm=False):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), SCHEMA)


def test_regex_choice_and_json_object_constraints_hold_batched_with_an_unconstrained_request(llm):
    plain = SamplingParams(temperature=0, max_tokens=8)
    params = [SamplingParams(temperature=0, max_tokens=12, structured_outputs=_constrained(regex=r"[A-Z][a-z]{2,8}")),
              SamplingParams(temperature=1.0, seed=3, max_tokens=12,
                             structured_outputs=_constrained(choice=["yes", "no", "maybe later"])),
              SamplingParams(temperature=0, max_tokens=60, structured_outputs=_constrained(json_object=True)),
              plain]
    prompts = ["The capital of France is", "Is water wet?", "A JSON object:", "The capital of France is"]
    regex, choice, obj, free = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert re.fullmatch(r"[A-Z][a-z]{2,8}", regex.text) and regex.finish_reason == "stop"
    assert choice.text in ("yes", "no", "maybe later") and choice.finish_reason == "stop"
    assert isinstance(json.loads(obj.text), dict)
    # The unconstrained request in the same batch gets the tokens it gets alone.
    alone = llm.generate(prompts[3:], plain, use_tqdm=False)[0].outputs[0]
    assert free.token_ids == alone.token_ids


def test_a_bad_schema_is_refused_before_anything_is_queued(llm):
    bad = SamplingParams(structured_outputs=_constrained(json={"type": "object", "properties": {"a": {"type": 3}}}))
    with pytest.raises(ValueError, match=r"structured_outputs\.json"):
        llm.generate(["x"], bad, use_tqdm=False)
    assert not llm.llm_engine.has_engine_work()

