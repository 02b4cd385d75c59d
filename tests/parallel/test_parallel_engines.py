"""TP, PP and TP x PP engines give the greedy tokens of the single-process engine, in float32, on every family."""
from __future__ import annotations

import pytest

from parallel_prompts import greedy_tokens
from jido import LLM
from jido.core.sampling_params import SamplingParams
from jido.layers import int8_dot
from jido.layers.quantized_layouts import layouts_of
from tiny_families import FAMILIES



@pytest.mark.parametrize("arch", FAMILIES)
def test_tensor_parallel_2_gives_the_single_process_tokens(arch, family_folder, single_process_tokens):
    llm = LLM(str(family_folder(arch)), dtype="float32", kv_cache_memory="4MiB", tensor_parallel_size=2)
    try:
        assert greedy_tokens(llm) == single_process_tokens(arch)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("arch", FAMILIES)
def test_pipeline_parallel_2_gives_the_single_process_tokens(arch, family_folder, single_process_tokens):
    llm = LLM(str(family_folder(arch)), dtype="float32", kv_cache_memory="4MiB", pipeline_parallel_size=2)
    try:
        assert greedy_tokens(llm) == single_process_tokens(arch)
    finally:
        llm.shutdown()


def test_tensor_2_by_pipeline_2_gives_the_single_process_tokens(family_folder, single_process_tokens):
    # Four ranks on two cores, one thread each: slow per step, so the shortest run that crosses stages and heads.
    llm = LLM(str(family_folder("gemma3")), dtype="float32", kv_cache_memory="4MiB", tensor_parallel_size=2,
              pipeline_parallel_size=2)
    try:
        assert greedy_tokens(llm) == single_process_tokens("gemma3")
        stats = llm.collective_rpc("parallel_stats")
        assert [s["num_steps"] for s in stats] == [stats[0]["num_steps"]] * 4  # every rank ran every step
    finally:
        llm.shutdown()


def test_each_tensor_parallel_rank_holds_half_the_heads_and_the_kv_head_replicated(family_folder):
    llm = LLM(str(family_folder("gemma3")), dtype="float32", kv_cache_memory="4MiB", tensor_parallel_size=2)
    try:
        heads = llm.collective_rpc(_attention_heads)
        assert heads == [(2, 1, 48), (2, 1, 48)]  # of 4 query heads, 1 KV head (replicated), MLP 96 wide
    finally:
        llm.shutdown()


def _attention_heads(worker) -> tuple[int, int, int]:
    layer = worker.runner.model.model.layers[0]
    return layer.self_attn.spec.num_heads, layer.self_attn.spec.num_kv_heads, layer.mlp.down_proj.weight.shape[1]


def _smoothing_state(worker) -> tuple[int, int]:
    """(linears smoothed, float copies still held) on this rank."""
    held = [layouts for layouts in map(layouts_of, worker.runner.model.modules()) if layouts is not None]
    return (sum(layouts.gemm_channel_scale is not None for layouts in held),
            sum(layouts.smoothing_source is not None for layouts in held))


def test_w8a8_is_smoothed_on_every_tensor_parallel_rank_and_left_unsmoothed_under_pipeline_parallelism(
        family_folder):
    # Every TP rank runs the calibration forward (its collectives line up: all ranks initialize their caches); a PP
    # stage cannot run a forward alone, so it keeps per-token rounding and drops its float copies.
    for parallel, smoothed in (({"tensor_parallel_size": 2}, True), ({"pipeline_parallel_size": 2}, False)):
        llm = LLM(str(family_folder("llama")), dtype="float32", kv_cache_memory="4MiB", quantization="w8a8",
                  **parallel)
        try:
            states = llm.collective_rpc(_smoothing_state)
            assert len(states) == 2 and all((count > 0) == smoothed and held == 0 for count, held in states), states
            assert all(tokens for tokens in greedy_tokens(llm))
        finally:
            llm.shutdown()


@pytest.mark.skipif(int8_dot.load_int8_dot_ops() is None, reason="the int8 kernels do not build here")
def test_gguf_w8a8_smooths_each_tensor_parallel_ranks_prefill_copies(tmp_path, monkeypatch):
    # Each rank's shards of the codes, dequantized, get their own smoothed int8 copy; decode keeps the codes.
    from test_quantized_linear import mixed_llama_for_engine

    path = mixed_llama_for_engine(tmp_path, monkeypatch, ffn=128)  # down's Q8_0 groups of 32 split whole over 2 ranks
    llm = LLM(str(path), dtype="bfloat16", kv_cache_memory="4MiB", quantization="gguf_w8a8", tensor_parallel_size=2)
    try:
        states = llm.collective_rpc(_smoothing_state)
        # q/k/v, gate/up and down's half (K 64); on AMX tiles o's half (K 32) is no tile multiple
        copies = 3 if int8_dot.amx_runs() else 4
        assert states == [(copies, 0), (copies, 0)]
        params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        assert len(llm.generate([{"prompt_token_ids": [1, 261, 262, 263] * 12}], params)[0].outputs[0].token_ids) == 4
    finally:
        llm.shutdown()


def test_a_start_that_fails_on_every_rank_reports_the_ranks_error_not_its_exit(tmp_path, monkeypatch):
    # Each rank reports its error and returns (exit code 0): the engine must raise with the error's text. It looked
    # for a dead peer first, and found the reporting rank itself gone whenever it had exited by then: made certain
    # here by a pause after that look's wait.
    import time

    from test_quantized_linear import mixed_llama_for_engine

    from jido.executor import multiproc_executor
    from jido.executor.abstract import WorkerError

    real_wait = multiproc_executor.wait
    monkeypatch.setattr(multiproc_executor, "wait", lambda *a, **k: (real_wait(*a, **k), time.sleep(1.0))[0])
    path = mixed_llama_for_engine(tmp_path, monkeypatch)  # FFN 96: each rank's 48 columns of down cut Q8_0's 32s
    with pytest.raises(WorkerError, match="cut through Q8_0's groups of 32: this tensor-parallel size cannot split"):
        LLM(str(path), dtype="float32", kv_cache_memory="4MiB", tensor_parallel_size=2)
