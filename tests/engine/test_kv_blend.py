"""CacheBlend through LLM on a tiny model: chunks prefilled alone first when the cache lacks them, the blend equal
to a full prefill at recompute ratio 1, the separator setting, and bad kv_blend input refused with nothing queued."""
from __future__ import annotations

from pathlib import Path

import pytest
from tiny_model_folder import write_tiny_model_folder

from jido import LLM, SamplingParams

DOCS = [" ".join(f"w{3 + (d * 37 + 5 * j) % 120}" for j in range(30)) for d in range(3)]
QUESTION = "w7 w8 w9 w10"
GREEDY = SamplingParams(temperature=0, max_tokens=6, logprobs=1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model_folder(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def llm(folder: Path) -> LLM:
    return LLM(str(folder), kv_cache_memory="8MiB", block_size=4, kv_blend_separator=" ## ")


def blend(ratio: float) -> dict:
    return {"prompt": QUESTION, "kv_blend": {"chunks": DOCS, "recompute_ratio": ratio}}


def test_uncached_chunks_are_prefilled_alone_first_and_then_reused(llm: LLM, monkeypatch: pytest.MonkeyPatch):
    llm.reset_prefix_cache()
    added = []
    core = llm.llm_engine.core
    original = core.add_request
    monkeypatch.setattr(core, "add_request", lambda request: (added.append(request), original(request)))
    first = llm.generate(blend(0.15), GREEDY, use_tqdm=False)[0]
    tokenizer = llm.get_tokenizer()
    standalone = [tokenizer.encode(doc) for doc in DOCS]
    assert [r.prompt_token_ids for r in added[:3]] == standalone and added[3].request_id == first.request_id
    assert [core.num_cached_tokens(ids) for ids in standalone] == [28, 28, 28]  # 31 tokens: 7 whole blocks each
    added.clear()
    second = llm.generate(blend(0.15), GREEDY, use_tqdm=False)[0]
    assert [r.request_id for r in added] == [second.request_id]  # every chunk was cached: no prefill first
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    chunks = [i for doc in DOCS for i in tokenizer.encode(doc)[1:]]
    assert first.prompt_token_ids == [tokenizer.bos_token_id, *chunks, *tokenizer.encode(QUESTION)[1:]]


def test_recomputing_every_token_gives_the_full_prefills_tokens_and_logprobs(llm: LLM):
    blended = llm.generate(blend(1.0), GREEDY, use_tqdm=False)[0]
    full = llm.generate({"prompt_token_ids": blended.prompt_token_ids}, GREEDY, use_tqdm=False)[0]
    assert blended.outputs[0].token_ids == full.outputs[0].token_ids
    for ours, theirs in zip(blended.outputs[0].logprobs, full.outputs[0].logprobs, strict=True):
        assert ours.sampled_token_id == theirs.sampled_token_id
        assert ours.sampled_logprob == pytest.approx(theirs.sampled_logprob, abs=1e-4)


def test_n_completions_of_a_blend_prompt_share_its_chunks(llm: LLM):
    outputs = llm.generate(blend(0.15), SamplingParams(n=2, temperature=0, max_tokens=4), use_tqdm=False)[0].outputs
    assert len(outputs) == 2 and outputs[0].token_ids == outputs[1].token_ids


def test_a_separator_splits_a_text_prompt_into_chunks_and_a_question(llm: LLM):
    split = llm.generate(" ## ".join([*DOCS, QUESTION]), GREEDY, use_tqdm=False)[0]
    field = llm.generate(blend(0.15), GREEDY, use_tqdm=False)[0]
    assert split.prompt_token_ids == field.prompt_token_ids
    assert split.outputs[0].token_ids == field.outputs[0].token_ids


@pytest.mark.parametrize("prompt, params, message", [
    ({"prompt": QUESTION, "kv_blend": {"chunks": []}}, GREEDY, "non-empty list"),
    ({"prompt": QUESTION, "kv_blend": {"chunks": DOCS, "ratio": 0.2}}, GREEDY, r"unknown key\(s\) \['ratio'\]"),
    ({"prompt": QUESTION, "kv_blend": {"chunks": DOCS, "recompute_ratio": 2}}, GREEDY, r"number in \[0, 1\]"),
    ({"prompt": QUESTION, "kv_blend": {"chunks": [[5, 500]]}}, GREEDY, "outside the vocabulary"),
    ({"prompt": QUESTION, "kv_blend": "a, b"}, GREEDY, "must be an object"),
    (blend(0.15), SamplingParams(max_tokens=1, prompt_logprobs=1), "cannot give prompt_logprobs"),
])
def test_bad_kv_blend_input_is_refused_and_the_engine_keeps_serving(llm: LLM, prompt: dict, params: SamplingParams,
                                                                    message: str):
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt, params, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.generate(QUESTION, GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_kv_blend_needs_the_prefix_cache(folder: Path):
    llm = LLM(str(folder), kv_cache_memory="8MiB", block_size=4, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="needs enable_prefix_caching"):
        llm.generate(blend(0.15), GREEDY, use_tqdm=False)


def test_a_blend_prompt_longer_than_one_steps_budget_is_refused(folder: Path):
    llm = LLM(str(folder), kv_cache_memory="8MiB", block_size=4, max_num_batched_tokens=64)
    with pytest.raises(ValueError, match=r"exceed max_num_batched_tokens=64"):
        llm.generate(blend(0.15), GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
