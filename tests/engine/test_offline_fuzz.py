"""Property-based fuzzing of the offline API: any SamplingParams keyword or prompt either works or raises a
ValueError or TypeError naming what was wrong, never an error from inside (torch, the tokenizer), and the
LLM keeps generating afterwards."""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_gemma import make_tiny_model

from jido import LLM, SamplingParams

GOOD = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
MAX_TOKENS = 3  # generations of fuzzed SamplingParams are cut to this many tokens, to stay quick
MAX_N = 4  # and to this many sequences: a drawn n of 15,000 is valid, and took many minutes to generate
FIELDS = [f.name for f in dataclasses.fields(SamplingParams) if f.init]
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory) -> LLM:
    model = str(make_tiny_model(tmp_path_factory.mktemp("tiny-gemma3")))
    return LLM(model=model, kv_cache_memory="16MiB", max_model_len=64, max_num_seqs=4)


STRINGS = st.text(st.characters(exclude_categories=()), max_size=10) | st.sampled_from(
    ["", "\x00", "\ud800", "x" * 3000, "<eos>", "é"])
INTEGERS = st.integers(-5, 300) | st.integers() | st.sampled_from(
    [2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 262143, 262144, 10**30])
FLOATS = st.floats() | st.sampled_from([1e-300, 5e-324, 3.5e38, 1e39, -0.0, 0.5])
SCALARS = (st.none() | st.booleans() | INTEGERS | FLOATS | STRINGS | st.binary(max_size=6)
           | st.complex_numbers(max_magnitude=10) | st.sampled_from([object(), math.pi]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                      | st.dictionaries(STRINGS, inner, max_size=3) | st.frozensets(INTEGERS, max_size=3),
                      max_leaves=8)
KWARGS = st.dictionaries(st.sampled_from(FIELDS) | st.sampled_from(["best_of", "stop_strings", "seed_"]),
                         VALUES | INTEGERS | FLOATS, max_size=4)
PROMPT = (STRINGS | st.lists(INTEGERS, max_size=6) | st.dictionaries(
    st.sampled_from(["prompt", "prompt_token_ids", "text"]), STRINGS | st.lists(INTEGERS, max_size=4) | VALUES,
    max_size=2) | VALUES)
PROMPTS = PROMPT | st.lists(PROMPT, max_size=3) | st.tuples(INTEGERS, INTEGERS)


def _still_serves(llm: LLM) -> None:
    assert not llm.llm_engine.has_unfinished_requests()
    assert len(llm.generate("Hello", GOOD, use_tqdm=False)[0].outputs[0].token_ids) == 2


@FUZZ
@given(kwargs=KWARGS)
def test_fuzzed_sampling_params_work_or_raise_naming_the_field(tiny_llm, kwargs):
    try:
        params = SamplingParams(**kwargs)
    except (ValueError, TypeError) as exc:
        assert any(name in str(exc) for name in kwargs), f"{exc!r} names none of {sorted(kwargs)}"
        return
    max_tokens = min(params.max_tokens or MAX_TOKENS, MAX_TOKENS)
    params = dataclasses.replace(params, max_tokens=max_tokens, min_tokens=min(params.min_tokens, max_tokens),
                                 n=min(params.n, MAX_N))
    output = tiny_llm.generate("Hello", params, use_tqdm=False)[0]
    assert len(output.outputs) == params.n
    assert all(1 <= len(c.token_ids) <= max_tokens for c in output.outputs)
    _still_serves(tiny_llm)


def _num_prompts(prompts: object) -> int | None:
    """How many prompts ``generate`` must see in ``prompts``, or None when it must refuse them outright."""
    if isinstance(prompts, (str, dict)):
        return 1
    if not isinstance(prompts, (list, tuple)) or not prompts:
        return None
    return 1 if all(type(t) is int for t in prompts) else len(prompts)


@settings(FUZZ, max_examples=80)
@given(prompts=PROMPTS)
def test_fuzzed_prompts_generate_or_raise_naming_the_prompt(tiny_llm, prompts):
    try:
        outputs = tiny_llm.generate(prompts, GOOD, use_tqdm=False)
    except (ValueError, TypeError) as exc:
        assert "prompt" in str(exc), repr(exc)
        _still_serves(tiny_llm)
        return
    assert len(outputs) == _num_prompts(prompts), prompts
    assert all(len(o.outputs[0].token_ids) == 2 for o in outputs)


@pytest.mark.parametrize("prompts, error, message", [
    (None, TypeError, "prompts must be a string, a list of token ids, a dict or a list of those, got NoneType"),
    (b"hi", TypeError, "got bytes"),  # not the token ids [104, 105]
    (7, TypeError, "got int"),
    ({"prompt_token_ids": "Hello"}, ValueError, "'prompt_token_ids' must be a list of token ids, got str"),
    ({"prompt_token_ids": [2], "prompt": 5}, ValueError, "'prompt' must be a string, got int"),
])
def test_prompts_of_the_wrong_type_raise_naming_them(tiny_llm, prompts, error, message):
    with pytest.raises(error, match=message):
        tiny_llm.generate(prompts, GOOD, use_tqdm=False)
    _still_serves(tiny_llm)


@pytest.mark.parametrize("params", [{"temperature": 0}, [GOOD, {"temperature": 0}], "greedy"])
def test_sampling_params_of_the_wrong_type_raise_type_error_naming_them(tiny_llm, params):
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams or a list of them"):
        tiny_llm.generate(["a", "b"], params, use_tqdm=False)
    _still_serves(tiny_llm)


def test_n_children_of_the_largest_seed_wrap_around_int64(tiny_llm):
    # Child i is seeded seed + i; past 2**63 - 1 that wraps to -2**63 instead of failing validation.
    params = SamplingParams(n=2, seed=2**63 - 1, max_tokens=3, ignore_eos=True)
    children = tiny_llm.generate("Once upon a time", params, use_tqdm=False)[0].outputs
    second = SamplingParams(seed=-(2**63), max_tokens=3, ignore_eos=True)
    first = SamplingParams(seed=2**63 - 1, max_tokens=3, ignore_eos=True)
    assert [c.token_ids for c in children] == [
        tiny_llm.generate("Once upon a time", p, use_tqdm=False)[0].outputs[0].token_ids for p in (first, second)]
