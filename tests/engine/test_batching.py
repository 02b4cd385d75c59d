"""Continuous batching, chunked prefill, prefix caching and preemption never change greedy tokens.

On float weights (``quantization="none"``, as the ``llm`` fixture): the default ``gguf`` kernels round x to
int8 for steps of up to 16 rows only, so there a prompt prefilled alone and one prefilled in a larger step
are computed differently (as vLLM's GGUF path does below 9 rows)."""
from __future__ import annotations

import pytest

from jido import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def mixed_prompts(tokenizer, gemma_reference) -> list[list[int]]:
    """16 prompts from 3 to ~700 tokens, cut from real text."""
    long_ids = next(g["prompt_ids"] for g in gemma_reference["generations"] if len(g["prompt_ids"]) > 512)
    lengths = [3, 5, 9, 17, 31, 40, 64, 100, 130, 200, 257, 300, 420, 513, 600, len(long_ids)]
    return [long_ids[:n] for n in lengths]


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def alone(llm, gemma_reference) -> list[list[int]]:
    llm.reset_prefix_cache()
    prompts = mixed_prompts(llm.get_tokenizer(), gemma_reference)
    return [token_ids(llm.generate([p], GREEDY, use_tqdm=False))[0] for p in prompts]


def test_batched_equals_unbatched(llm, gemma_reference, alone):
    llm.reset_prefix_cache()
    together = llm.generate(mixed_prompts(llm.get_tokenizer(), gemma_reference), GREEDY, use_tqdm=False)
    assert token_ids(together) == alone


def test_reference_attention_batched_equals_default_attention_unbatched(gemma_reference, alone):
    # The llm fixture runs the device's default backend (tiled on CPU); the reference backend must agree.
    reference = LLM(kv_cache_memory="160MiB", attention_backend="torch", dtype="float32", quantization="none")
    outputs = reference.generate(mixed_prompts(reference.get_tokenizer(), gemma_reference), GREEDY, use_tqdm=False)
    assert token_ids(outputs) == alone


def test_chunked_prefill_equals_whole_prefill(gemma_reference, alone):
    chunked = LLM(kv_cache_memory="160MiB", max_num_batched_tokens=48, enable_prefix_caching=False, dtype="float32",
                  quantization="none")
    outputs = chunked.generate(mixed_prompts(chunked.get_tokenizer(), gemma_reference), GREEDY, use_tqdm=False)
    assert token_ids(outputs) == alone


def test_without_chunked_prefill_every_prompt_is_computed_in_one_step_with_the_same_tokens(gemma_reference, alone):
    whole = LLM(kv_cache_memory="160MiB", max_num_batched_tokens=768, enable_chunked_prefill=False, dtype="float32",
                quantization="none")
    assert whole.llm_engine.core.kv_plan.max_model_len == 768  # a request must fit one step's budget
    outputs = whole.generate(mixed_prompts(whole.get_tokenizer(), gemma_reference), GREEDY, use_tqdm=False)
    assert token_ids(outputs) == alone


def test_prefix_cache_hit_gives_the_same_tokens_and_is_visible(llm, gemma_reference, alone):
    prompts = mixed_prompts(llm.get_tokenizer(), gemma_reference)
    llm.reset_prefix_cache()
    first = llm.generate([prompts[-1]], GREEDY, use_tqdm=False)[0]
    second = llm.generate([prompts[-1]], GREEDY, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == (len(prompts[-1]) - 1) // 16 * 16
    assert second.outputs[0].token_ids == first.outputs[0].token_ids == alone[-1]


def test_small_kv_pool_preempts_and_every_request_finishes_with_the_same_tokens(llm, gemma_reference):
    # 48 blocks of 16 = 768 tokens for ~3.3k tokens of prompts plus 40 outputs each: requests take turns,
    # and decodes that cross a block boundary with no block free preempt the newest request.
    longer = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = mixed_prompts(llm.get_tokenizer(), gemma_reference)
    small = LLM(kv_cache_memory=48 * 16 * 36864, max_model_len=768, dtype="float32", quantization="none")
    outputs = small.generate(prompts, longer, use_tqdm=False)
    stats = small.llm_engine.get_scheduler_stats()
    assert stats.num_preemptions > 0
    assert stats.kv_cache_usage == 0.0
    assert token_ids(outputs) == token_ids(llm.generate(prompts, longer, use_tqdm=False))
