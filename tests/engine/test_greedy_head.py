"""Greedy steps whose rows need nothing but each row's argmax take it from the LM head's kernel, without logits, where
the kernel can (AMX panels): the very tokens of the logits path. With it, a batch-1 verify step of up to 4 rows gives
each row the bits a one-row step gives it, so speculation leaves greedy text exactly as it was, in bf16 too."""
from __future__ import annotations

import pytest
from tiny_model_folder import BOS_ID, write_tiny_model_folder

from jido import LLM, SamplingParams
from jido.layers import int8_dot
from jido.tools.train_draft import held_out_text

pytestmark = pytest.mark.skipif(not int8_dot.amx_runs(), reason="the head's argmax kernel runs on AMX panels")

PROMPTS = [[BOS_ID, 5 + i, 9, 17 + 2 * i, 40 - i] for i in range(5)]


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}


@pytest.fixture(scope="module")
def quantized_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_tiny_model_folder(tmp_path_factory.mktemp("greedy-head"), weight_scale=0.2,
                                       final_logit_softcapping=None))


@pytest.fixture(scope="module")
def quantized_llm(quantized_folder: str) -> LLM:
    return LLM(model=quantized_folder, quantization="int8", dtype="float32", kv_cache_memory="16MiB")


def _generate(llm: LLM, params: SamplingParams, fused: bool) -> tuple[list[list[int]], list[int]]:
    """Each prompt's tokens, and the row counts of the steps the head's kernel chose tokens for."""
    model = llm.llm_engine.core.executor.worker.runner.model
    kernel, calls = model.greedy_token_ids, []

    def counted(hidden):
        tokens = kernel(hidden) if fused else None
        if tokens is not None:
            calls.append(hidden.shape[0])
        return tokens

    model.greedy_token_ids = counted
    try:
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        model.greedy_token_ids = kernel
    return [o.outputs[0].token_ids for o in outputs], calls


def test_batched_greedy_tokens_from_the_head_kernel_equal_the_logits_argmax(quantized_llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    ours, calls = _generate(quantized_llm, params, fused=True)
    expected, _ = _generate(quantized_llm, params, fused=False)
    assert ours == expected
    assert calls and max(calls) == len(PROMPTS)  # the batched decode steps took the kernel's tokens


def test_steps_with_logprobs_or_penalties_make_the_logits(quantized_llm: LLM) -> None:
    for params in (SamplingParams(temperature=0, max_tokens=4, logprobs=2),
                   SamplingParams(temperature=0, max_tokens=4, repetition_penalty=1.3)):
        _, calls = _generate(quantized_llm, params, fused=True)
        assert calls == []


def test_speculative_steps_verify_on_the_head_kernels_argmax_with_the_plain_tokens(quantized_llm: LLM,
                                                                                   quantized_folder: str) -> None:
    spec_llm = LLM(model=quantized_folder, quantization="int8", dtype="float32", kv_cache_memory="16MiB",
                   speculative_config=NGRAM)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    ours, calls = _generate(spec_llm, params, fused=True)
    expected, _ = _generate(quantized_llm, params, fused=False)
    assert ours == expected
    # Steps that verified proposals (more rows than requests) took their tokens from the kernel.
    assert calls and max(calls) > len(PROMPTS)



def test_on_the_default_model_speculation_leaves_greedy_bf16_text_as_it_was() -> None:
    # The default GGUF in bf16 (jido's defaults). Before verify steps of up to 4 rows took the rows kernels, their
    # rows were summed on the panels in another order, and EAGLE's greedy text parted from the plain one within 30
    # tokens on 5 of 6 held-out prompts (benchmarks/results/spec-decode-2026-12-05-amx.md).
    prompts = [held_out_text()[i * 3000:i * 3000 + 1200] for i in range(2)]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    spec_config = {**NGRAM, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
    expected = [LLM(kv_cache_memory="64MiB").generate([p], params, use_tqdm=False)[0].outputs[0].token_ids
                for p in prompts]
    spec = LLM(kv_cache_memory="64MiB", speculative_config=spec_config)
    assert [spec.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts] == expected
    assert spec.llm_engine.get_scheduler_stats().spec_decoding.num_draft_tokens > 0
