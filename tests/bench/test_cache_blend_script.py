"""benchmarks/cache_blend.py on a tiny model: a recompute ratio of 1 is the full prefill (KL 0, every greedy token
the same), naive reuse is not, and the summary's ratios come from the rows."""
from __future__ import annotations

import pytest
from benchmark_scripts import load_benchmark
from tiny_model_folder import write_tiny_model_folder

from jido import LLM

cache_blend = load_benchmark("cache_blend")


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    folder = write_tiny_model_folder(tmp_path_factory.mktemp("tiny"))
    return LLM(str(folder), kv_cache_memory="8MiB", block_size=4, max_num_batched_tokens=256, dtype="float32",
               kv_blend_check_layer=0)  # its layer 2 is a window of 4: only layer 1 sees the chunks


def test_full_recompute_matches_the_full_prefill_and_naive_reuse_does_not(llm: LLM):
    tap = cache_blend.LogitsTap(llm)
    docs = [[3 + (d * 29 + 5 * j) % 120 for j in range(40)] for d in range(3)]
    prompt = {"docs": [2, 0, 1], "question": " w5 w6", "quote": [7, 8, 9]}
    row = cache_blend.run_prompt(llm, tap, prompt, docs, [0.0, 1.0], max_tokens=6)
    assert row["prompt_tokens"] == 1 + 3 * 40 + len(llm.get_tokenizer().encode(" w5 w6", add_special_tokens=False)) + 3
    full, naive = row["ratios"]["1.0"], row["ratios"]["0.0"]
    assert full["kl"] == pytest.approx(0.0, abs=1e-6) and full["top1_agrees"] and full["agreeing_tokens"] == 6
    assert naive["kl"] > 1e-4
    summary = cache_blend.summarize([row], [0.0, 1.0], max_tokens=6)
    assert summary["1.0"]["greedy_agreeing_share"] == 1.0
    assert summary["0.0"]["ttft_ratio_to_full"] == pytest.approx(naive["ttft_s"] / row["full_ttft_s"])
