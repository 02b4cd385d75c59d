"""The C++ kernels built with OpenMP (as shipped) against the same sources built without it, in one run.

Until 2026-12-02 jido compiled its kernels with ``-fopenmp-simd`` only. ATen's ``at::parallel_for`` is inline
code that forks threads only under ``_OPENMP``, so every kernel ran on one thread whatever torch's thread count
(see ``jido/utils/cpp_build.py``). This times the default engine both ways, each mode in a fresh process (a
process holds one build of a library): batch-1 decode (one 128-token prompt, 128 greedy tokens) and 16
prompts of 256 random tokens decoding 128 each in one ``generate`` call; modes interleaved per round.

    .venv/bin/python benchmarks/kernel_threads.py [--rounds 3] \\
        [--out benchmarks/results/kernel_threads-<date>-<cpu kind>.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from jido.bench.machine import machine_info, now_iso

MODES = {"openmp": None, "serial": (["-O3", "-fopenmp-simd"], [])}


def child(mode: str) -> dict:
    """Run in a fresh process: build the kernels as ``mode`` says, time the two workloads."""
    import random

    from jido.utils import cpp_build
    if MODES[mode] is not None:
        cpp_build.COMMON_FLAGS, cpp_build.LINK_FLAGS = MODES[mode]
    from jido import LLM, SamplingParams

    llm = LLM()
    rng = random.Random(0)

    def prompt(n: int) -> dict:  # ids well inside Gemma 3's 262,144-token vocabulary
        return {"prompt_token_ids": [rng.randrange(1000, 200_000) for _ in range(n)]}

    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    llm.generate([prompt(16)], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    start = time.perf_counter()
    llm.generate([prompt(128)], params)
    batch1 = 128 / (time.perf_counter() - start)
    prompts = [prompt(256) for _ in range(16)]
    start = time.perf_counter()
    llm.generate(prompts, params)
    c16 = 16 * 128 / (time.perf_counter() - start)
    return {"batch1_tok_s": batch1, "c16_tok_s": c16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", choices=list(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for r in range(args.rounds):
        for mode in MODES:
            out = subprocess.run([sys.executable, __file__, "--child", mode], capture_output=True, text=True,
                                 check=True).stdout.strip().splitlines()[-1]
            runs[mode].append(json.loads(out))
            print(f"round {r + 1} {mode}: {runs[mode][-1]}", flush=True)
    medians = {mode: {key: statistics.median(run[key] for run in rs) for key in rs[0]} for mode, rs in runs.items()}
    for key in medians["openmp"]:
        print(f"{key}: openmp {medians['openmp'][key]:.1f}, serial {medians['serial'][key]:.1f}, "
              f"{medians['openmp'][key] / medians['serial'][key]:.2f}x")
    if args.out:
        args.out.write_text(json.dumps({"date": now_iso(), "machine": machine_info(), "rounds": args.rounds,
                                        "runs": runs, "medians": medians}, indent=2) + "\n")


if __name__ == "__main__":
    main()
