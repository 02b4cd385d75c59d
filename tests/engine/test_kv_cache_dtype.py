"""A quantized KV cache (``kv_cache_dtype``) through the engine: prefill and decode close to the float cache,
prefix-cache hits and preemption unchanged, and more tokens in the same memory."""
from __future__ import annotations

import logging

import pytest
import torch
from tiny_model_folder import BOS_ID, VOCAB_SIZE

from jido import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
SCORE = SamplingParams(max_tokens=0, prompt_logprobs=1)


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [[BOS_ID, *torch.randint(3, VOCAB_SIZE, (n,), generator=gen).tolist()] for n in (5, 11, 23, 40)]


def _llm(folder, kv_cache_dtype: str, **kwargs) -> LLM:
    return LLM(str(folder), dtype="float32", kv_cache_memory="1MiB", block_size=4, kv_cache_dtype=kv_cache_dtype,
               **kwargs)


def _tokens(llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def auto_llm(tiny_model_folder) -> LLM:
    return _llm(tiny_model_folder, "auto")


@pytest.fixture(scope="module")
def int8_llm(tiny_model_folder) -> LLM:
    return _llm(tiny_model_folder, "int8")


def test_int8_kv_gives_the_greedy_tokens_and_prompt_logprobs_of_the_float_cache(auto_llm, int8_llm):
    prompts = _prompts()
    assert _tokens(int8_llm, prompts) == _tokens(auto_llm, prompts)
    scored = [llm.generate(prompts, SCORE, use_tqdm=False) for llm in (auto_llm, int8_llm)]
    for a, b in zip(*scored):
        gaps = [abs(x[t].logprob - y[t].logprob) for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:])
                for t in x]
        assert max(gaps) < 0.02  # int8 keys and values move a logprob of this tiny model by < 0.02


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("backend", ["torch", "tiled"])
def test_fp8_kv_prefill_and_decode_run_on_every_cpu_backend(tiny_model_folder, auto_llm, backend, kv_cache_dtype):
    llm = _llm(tiny_model_folder, kv_cache_dtype, attention_backend=backend)
    prompts = _prompts()[:2]
    tokens = _tokens(llm, prompts)
    assert all(len(t) == GREEDY.max_tokens for t in tokens)
    if kv_cache_dtype == "fp8_e4m3":  # 3 mantissa bits keep this model's greedy tokens; e5m2's 2 need not
        assert tokens == _tokens(auto_llm, prompts)


def test_prefix_cache_hit_on_an_int8_cache_gives_the_same_tokens(int8_llm):
    prompt = _prompts()[3]
    int8_llm.reset_prefix_cache()
    first, second = (int8_llm.generate([prompt], GREEDY, use_tqdm=False)[0] for _ in range(2))
    assert (first.num_cached_tokens, second.num_cached_tokens) == (0, 40)
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def test_preempted_requests_on_an_int8_cache_resume_with_the_same_tokens(tiny_model_folder, int8_llm):
    # 60 blocks of 4 tokens over three layer groups for four prompts of up to 41 tokens plus 24 outputs each:
    # requests take turns.
    longer = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    small = LLM(str(tiny_model_folder), dtype="float32", block_size=4, kv_cache_dtype="int8",
                kv_cache_memory=20 * 3 * 160, max_model_len=80, enable_prefix_caching=False)
    tokens = _tokens(small, _prompts(), longer)
    assert small.llm_engine.get_scheduler_stats().num_preemptions > 0
    assert tokens == [_tokens(int8_llm, [p], longer)[0] for p in _prompts()]


def test_int8_kv_holds_more_blocks_in_the_same_memory_and_logs_it(tiny_model_folder, auto_llm, caplog):
    with caplog.at_level(logging.INFO, logger="jido"):
        int8 = _llm(tiny_model_folder, "int8")
    # Three groups of one layer: a pool block is one layer's 2 (K, V) x 4 tokens x 1 KV head x 16 dims x 4 bytes
    # (float32), or x (16 + 4) bytes (int8 values and a float32 scale): 3.2x the tokens.
    blocks = [llm.llm_engine.core.kv_plan.kv_cache_config.num_blocks for llm in (auto_llm, int8)]
    assert blocks == [2**20 // 512, 2**20 // 160]
    assert f"KV cache (int8): {blocks[1]} blocks of 4 tokens, 160 bytes each" in caplog.text
