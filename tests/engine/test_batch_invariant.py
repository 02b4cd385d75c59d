"""batch_invariant on tiny random Gemma 3 models, in float32 (dense layers on oneDNN) and int8 (the int8 panels): a
request's logprobs and greedy tokens are the same alone, batched, cached and chunked (tests/invariance_checks.py); and
on the default model, cached and batched."""
from __future__ import annotations

from pathlib import Path

import pytest
from invariance_checks import PARAMS, check_invariance, prompts, results
from tiny_model_folder import BOS_ID, write_tiny_model_folder

from jido import LLM, SamplingParams
from jido.layers import int8_dot


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_tiny_gemma_logprobs_are_the_same_alone_batched_cached_and_chunked(tmp_path: Path, quantization: str) -> None:
    if quantization == "int8" and int8_dot.load_int8_dot_ops() is None:
        pytest.skip("no int8 dot kernel for this CPU")
    folder = write_tiny_model_folder(tmp_path, weight_scale=0.2)
    check_invariance(str(folder), quantization, prompts(BOS_ID, 128))


@pytest.mark.slow
def test_the_default_model_keeps_a_windows_logprobs_after_a_cached_prefix_and_in_a_batch(gemma_reference) -> None:
    # Gemma 3 270M on its GGUF's codes: after 320 cached tokens the last 10 run as a decode-sized step, where the cold
    # prompt ran a prefill-sized one; without batch_invariant its logprobs moved there
    # (benchmarks/results/cache_invariance-2026-12-07-xeon-vnni-gemma-3-270m.md).
    long_ids = next(g["prompt_ids"] for g in gemma_reference["generations"] if len(g["prompt_ids"]) > 512)
    window, others = long_ids[:330], [long_ids[100:150], long_ids[200:417]]
    llm = LLM(kv_cache_memory="64MiB", batch_invariant=True)
    cold = results(llm, [window], PARAMS)[0]
    llm.generate([{"prompt_token_ids": window[:321]}], SamplingParams(max_tokens=1), use_tqdm=False)
    warm = llm.generate([{"prompt_token_ids": window}], PARAMS, use_tqdm=False)[0]
    assert warm.num_cached_tokens == 320
    assert (warm.outputs[0].token_ids, warm.outputs[0].logprobs, None) == cold
    llm.reset_prefix_cache()
    assert results(llm, [others[0], window, others[1]], PARAMS)[1] == cold
    llm.shutdown()
