"""Greedy steps whose rows need nothing but each row's argmax take it from the LM head's kernel, without logits, where
the kernel can (AMX panels, any number of rows; vector panels, the steps of rows that run on them): the very tokens of
the logits path."""
from __future__ import annotations

import pytest
import torch
from tiny_model_folder import BOS_ID, write_tiny_model_folder

from jido import LLM, SamplingParams
from jido.layers import int8_dot
from jido.layers.linear import Linear
from jido.layers.parameter import default_device_and_dtype
from jido.layers.quantization import get_quantization_config

pytestmark = pytest.mark.skipif(int8_dot.load_int8_dot_ops() is None, reason="the head's argmax runs on int8 panels")

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


def test_a_bf16_models_greedy_head_tells_apart_logits_that_round_to_one_bf16_value() -> None:
    # compute_logits gives the sampler float32 logits in a bf16 model too, so the kernel's argmax must pick the larger
    # of two logits that bf16 would round to one value, not the first: else a greedy request's token would depend on
    # whether its step made logits (another row wanting logprobs, say) or took the kernel's argmax.
    gen = torch.Generator().manual_seed(5)
    codes = torch.randint(-20, 21, (64, 96), generator=gen).float()  # int8 per output channel: codes * 2^-6 exactly
    codes[20] = torch.randint(-127, 128, (96,), generator=gen).float()
    codes[20, 0] = 127  # the row's scale: 127 * 2^-6 / 127
    k = int(torch.nonzero(codes[20, 1:] > 0)[0]) + 1
    codes[41] = codes[20]
    codes[41, k] += 1  # one code more where x is positive: a logit ~0.002 larger, at ~16 (bf16 steps of 0.0625)
    with default_device_and_dtype(torch.device("cpu"), torch.bfloat16):
        head = Linear(96, 64, quant_config=get_quantization_config("int8"))
    head.weight.weight_loader(head.weight, (codes * 2**-6).bfloat16())
    method = head.linear_method
    method.process_weights_after_loading(head)
    hidden = (codes[20] * 2**-9).bfloat16().repeat(4, 1)  # 4 rows: the vector panels' route
    logits = method.apply_logits(head, hidden)
    assert logits.dtype == torch.float32 and bool((logits[:, 41] > logits[:, 20]).all())
    assert torch.equal(logits[:, 41].bfloat16(), logits[:, 20].bfloat16())  # one value in bf16
    assert logits.argmax(dim=-1).tolist() == [41] * 4
    assert method.greedy_token_ids(head, hidden).tolist() == [41] * 4
