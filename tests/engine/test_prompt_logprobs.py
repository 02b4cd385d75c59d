"""Prompt logprobs (vLLM's ``SamplingParams.prompt_logprobs``): each prompt token scored given the tokens before it."""
from __future__ import annotations

import pytest
import torch
from tiny_model_folder import BOS_ID, VOCAB_SIZE, reference_logprobs, token_text

from jido import LLM, SamplingParams
from jido.runner import prompt_logprobs

ATOL = 1e-4  # the engine computes in float32 (asked for, so on any device), the reference in float64
SCORE = SamplingParams(max_tokens=0, prompt_logprobs=3)


def _prompt(seed: int, n: int) -> list[int]:
    words = torch.randint(3, VOCAB_SIZE, (n - 1,), generator=torch.Generator().manual_seed(seed))
    return [BOS_ID, *words.tolist()]


def _assert_close(a: list[dict | None], b: list[dict | None]) -> None:
    """Same tokens, ranks and texts at every position, and logprobs within ATOL."""
    assert len(a) == len(b) and a[0] is None and b[0] is None
    for x, y in zip(a[1:], b[1:]):
        assert list(x) == list(y)
        for t in x:
            assert (x[t].rank, x[t].decoded_token) == (y[t].rank, y[t].decoded_token)
            assert x[t].logprob == pytest.approx(y[t].logprob, abs=ATOL)


@pytest.fixture(scope="module")
def tiny_llm(tiny_model_folder) -> LLM:
    return LLM(str(tiny_model_folder), dtype="float32", kv_cache_memory="4MiB", block_size=4)


def test_prompt_logprobs_are_the_float64_log_softmax_of_transformers_at_each_position(tiny_llm, tiny_model_folder):
    prompt = _prompt(1, 23)
    out = tiny_llm.generate(prompt, SCORE, use_tqdm=False)[0]
    reference = reference_logprobs(tiny_model_folder, prompt)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for position, (token, scores) in enumerate(zip(prompt[1:], out.prompt_logprobs[1:]), start=1):
        expected = reference[position - 1]  # the logits at position - 1 predict the token at position
        top = expected.topk(3).indices.tolist()
        assert list(scores) == [token] + [t for t in top if t != token]
        assert scores[token].rank == int((expected >= expected[token]).sum())
        assert all(scores[t].rank == rank for rank, t in enumerate(top, start=1))
        assert all(abs(scores[t].logprob - expected[t].item()) < ATOL for t in scores)
        assert all(scores[t].decoded_token == token_text(t) for t in scores)
    completion = out.outputs[0]
    assert (completion.token_ids, completion.text, completion.finish_reason) == ([], "", "length")


def test_prompt_logprobs_leave_the_generated_tokens_unchanged(tiny_llm):
    prompt = _prompt(2, 17)
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    plain, both, scored = tiny_llm.generate(
        [prompt] * 3, [greedy, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, prompt_logprobs=3), SCORE],
        use_tqdm=False)
    assert plain.prompt_logprobs is None
    assert both.outputs[0].token_ids == plain.outputs[0].token_ids and len(plain.outputs[0].token_ids) == 6
    _assert_close(both.prompt_logprobs, scored.prompt_logprobs)


def test_chunked_prefill_and_prefix_caching_give_the_prompt_logprobs_of_a_plain_run(tiny_llm, tiny_model_folder,
                                                                                      monkeypatch):
    monkeypatch.setattr(prompt_logprobs, "_MAX_LOGITS", 3 * VOCAB_SIZE)  # logits of 3 rows at a time
    shared = _prompt(3, 13)
    prompts = [shared + _prompt(4, 9)[1:], shared + _prompt(5, 11)[1:], _prompt(6, 30)]
    params = [SCORE, SamplingParams(max_tokens=3, temperature=0), SamplingParams(max_tokens=2, prompt_logprobs=1)]
    plain = [tiny_llm.generate(p, s, use_tqdm=False)[0] for p, s in zip(prompts, params)]
    chunked = LLM(str(tiny_model_folder), dtype="float32", kv_cache_memory="4MiB", block_size=4,
                  max_num_batched_tokens=7)
    chunked.generate(shared + [7], SamplingParams(max_tokens=1), use_tqdm=False)  # caches the shared prefix
    outputs = chunked.generate(prompts, params, use_tqdm=False)
    assert [o.num_cached_tokens for o in outputs] == [0, 12, 0]  # the scored prompts skip the cache
    _assert_close(outputs[0].prompt_logprobs, plain[0].prompt_logprobs)
    _assert_close(outputs[2].prompt_logprobs, plain[2].prompt_logprobs)
    assert outputs[1].prompt_logprobs is None and outputs[1].outputs[0].token_ids == plain[1].outputs[0].token_ids


def test_n_completions_report_the_prompt_logprobs_once(tiny_llm):
    prompt = _prompt(7, 10)
    out = tiny_llm.generate(prompt, SamplingParams(n=3, max_tokens=2, seed=1, prompt_logprobs=2), use_tqdm=False)[0]
    alone = tiny_llm.generate(prompt, SamplingParams(max_tokens=0, prompt_logprobs=2), use_tqdm=False)[0]
    assert len(out.outputs) == 3 and all(len(c.token_ids) == 2 for c in out.outputs)
    _assert_close(out.prompt_logprobs, alone.prompt_logprobs)
