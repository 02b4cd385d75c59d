"""Where an engine step's time goes on a CUDA GPU: Python (cProfile) and PyTorch ops (torch.profiler).

The random Gemma 3 270M-shaped model of benchmarks/cuda_engine.py, bfloat16, per attention backend: one request
decoding 64 tokens, and 32 requests decoding 32 tokens together. Writes one text file per (backend, batch) with
the step split the engine measures itself (IterationStats medians), the top functions by own time, and the top
PyTorch ops by CPU time with the GPU time beside them.

    python benchmarks/cuda_step_profile.py --out DIR
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.cuda_engine import SHAPES, prompts, write_random_model
from jido import LLM, SamplingParams

STATS_FIELDS = ("schedule_s", "prepare_s", "model_s", "sample_s", "update_s")


def step_split(llm: LLM, batch: int, tokens: int, vocab: int) -> str:
    """Medians of the engine's own IterationStats over a run, in ms."""
    core = llm.llm_engine.core
    original, seen = core.step, []

    def step():
        outputs = original()
        if outputs.iteration_stats is not None:
            seen.append(outputs.iteration_stats)
        return outputs

    core.step = step
    start = time.perf_counter()
    llm.generate(prompts(batch, 64, vocab, seed=5), SamplingParams(max_tokens=tokens, ignore_eos=True),
                 use_tqdm=False)
    wall = time.perf_counter() - start
    core.step = original
    split = {name: 1e3 * statistics.median(getattr(s, name) for s in seen) for name in STATS_FIELDS}
    return f"steps {len(seen)}, wall {wall * 1e3 / max(len(seen), 1):.2f} ms a step; medians ms: {split}\n"


def profiles(llm: LLM, batch: int, tokens: int, vocab: int) -> str:
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    profiler = cProfile.Profile()
    profiler.enable()
    llm.generate(prompts(batch, 64, vocab, seed=6), params, use_tqdm=False)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        llm.generate(prompts(batch, 64, vocab, seed=7), params, use_tqdm=False)
    ops = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60)
    return text.getvalue() + "\n" + ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backends", nargs="+", default=["triton", "torch"])
    parser.add_argument("--device", default="cuda", help="cpu only to try the script itself")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    config = SHAPES["gemma-3-270m-shape"]()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_random_model(Path(tmp) / "model", config, std=0.05)
        for backend in args.backends:
            llm = LLM(model=str(folder), device=args.device, dtype="bfloat16", attention_backend=backend,
                      kv_cache_memory="8GiB", max_model_len=4096, max_num_seqs=64)
            llm.generate(prompts(2, 64, config.vocab_size, seed=9), SamplingParams(max_tokens=16), use_tqdm=False)
            for batch, tokens in ((1, 64), (32, 32)):
                report = step_split(llm, batch, tokens, config.vocab_size)
                print(backend, batch, report, flush=True)
                report += profiles(llm, batch, tokens, config.vocab_size)
                (args.out / f"profile-{backend}-b{batch}.txt").write_text(report)
            del llm
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
