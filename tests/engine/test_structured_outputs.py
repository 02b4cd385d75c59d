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



def test_greedy_constrained_rows_of_the_default_kernels_take_the_heads_masked_argmax_with_the_logits_paths_tokens():
    # Many rows a step, so the default model's head runs on its vector panels, whose argmax kernel skips the tokens
    # each row's grammar bans; the same requests with that kernel turned off (logits, masks, the sampler's argmax)
    # must give the same tokens.
    prompts = [f"Record {i} of a city database, as JSON:" for i in range(12)]
    params = SamplingParams(temperature=0, max_tokens=24, structured_outputs=_constrained(json=SCHEMA))
    with LLM(kv_cache_memory="32MiB", dtype="float32") as default:
        model = default.llm_engine.core.executor.worker.runner.model
        kernel, masked_steps = model.greedy_token_ids, []

        def counted(hidden, allowed=None):
            tokens = kernel(hidden, allowed)
            if tokens is not None and allowed is not None:
                masked_steps.append(hidden.shape[0])
            return tokens

        model.greedy_token_ids = counted
        fused = [o.outputs[0].token_ids for o in default.generate(prompts, params, use_tqdm=False)]
        model.greedy_token_ids = lambda hidden, allowed=None: None
        logits_path = [o.outputs[0].token_ids for o in default.generate(prompts, params, use_tqdm=False)]
        model.greedy_token_ids = kernel
    assert fused == logits_path
    if not masked_steps:  # AMX panels: the plain argmax, and logits for the rows a grammar bans (checked just above)
        pytest.skip("the head's masked argmax kernel did not run here (its rows are not on vector panels on this CPU)")
    assert max(masked_steps) == len(prompts)
