"""A greedy step's LM head: its logits then the sampler's argmax, against the panels' argmax kernel, which never
writes them (``int8_dot.panel_argmax``), in one process, alternating.

``--part kernel``: the LM head's shape (262,144 x 640, Q8_0-like codes, the default model's tied embedding), bf16
rows of x at each ``--rows``: ``panel_linear`` of ``x.float()`` + ``sampler.argmax`` (what a greedy step ran:
``compute_logits``' float32 logits) against ``panel_argmax``; the token ids are checked equal.
``--part engine``: the default model (bf16), 16 prompts of 256 random tokens, 128 greedy tokens each, offline, with
the model's ``greedy_token_ids`` on (the kernel) and off (the logits path) in alternate rounds: the run's time and
its median decode step.

    .venv/bin/python benchmarks/greedy_head.py --part kernel --rows 2 8 16 32
    .venv/bin/python benchmarks/greedy_head.py --part engine --rounds 4
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from jido.layers import int8_dot, quant_kernels
from jido.sampling.sampler import argmax
from jido.utils.malloc_policy import keep_freed_blocks


def kernel(rows_list: list[int], rounds: int) -> None:
    """The head's logits and argmax against panel_argmax, per number of rows."""
    keep_freed_blocks()  # as a CPU worker runs: no fresh pages for every call's logits
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(-127, 128, (262144, 640), dtype=torch.int8, generator=gen)
    w = quant_kernels.pack(codes, torch.rand(262144, 20, generator=gen) * 0.01 + 1e-3, None, 32, 8)
    panels = int8_dot.pack_panels(w, per_token=False, amx=False)
    print(f"LM head [262144, 640], {torch.get_num_threads()} threads: logits + argmax against panel_argmax")
    for rows in rows_list:
        x = torch.randn(rows, 640, generator=gen).bfloat16()
        times: dict[str, list[float]] = {"logits": [], "kernel": []}
        for r in range(rounds):
            for name in (("logits", "kernel") if r % 2 else ("kernel", "logits")):
                start = time.perf_counter()
                # the engine's logits path: compute_logits multiplies hidden.float() (float32 logits)
                ids = argmax(int8_dot.panel_linear(x.float(), panels)) if name == "logits" else \
                    int8_dot.panel_argmax(x, panels)
                times[name].append(time.perf_counter() - start)
                if name == "kernel":
                    kernel_ids = ids
                else:
                    logits_ids = ids
            if not torch.equal(kernel_ids, logits_ids):
                raise SystemExit(f"{rows} rows: the kernel's ids differ from the logits' argmax")
        ratio = statistics.median(k / lg for k, lg in zip(times["kernel"], times["logits"]))
        print(f"{rows:>4} rows: logits + argmax {1e3 * statistics.median(times['logits']):.2f} ms, panel_argmax "
              f"{1e3 * statistics.median(times['kernel']):.2f} ms, median paired ratio {ratio:.3f}", flush=True)


def engine(rounds: int) -> None:
    """16 streams of 256 -> 128 greedy tokens offline, the head's argmax kernel on and off in alternate rounds."""
    from jido import LLM, SamplingParams

    llm = LLM(dtype="bfloat16", kv_cache_memory="2GiB")
    core = llm.llm_engine
    model = core.core.executor.worker.runner.model
    fused = model.greedy_token_ids
    rng = random.Random(0)

    def run(n: int = 16, length: int = 256, tokens: int = 128) -> tuple[float, float]:
        core.reset_prefix_cache()
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        for i in range(n):
            prompt = [2] + [rng.randrange(1000, 200000) for _ in range(length - 1)]
            core.add_request(f"greedy-{time.perf_counter_ns()}-{i}", prompt, params)
        decode, start = [], time.perf_counter()
        while core.has_unfinished_requests():
            step_start = time.perf_counter()
            core.step()
            stats = core.last_iteration_stats
            if stats.num_tokens == stats.num_reqs:  # decode only
                decode.append(time.perf_counter() - step_start)
        return time.perf_counter() - start, statistics.median(decode)

    run(4, 64, 8)  # warm-up
    results: dict[str, list[tuple[float, float]]] = {"kernel": [], "logits": []}
    for r in range(rounds):
        for name in (("kernel", "logits") if r % 2 else ("logits", "kernel")):
            model.greedy_token_ids = fused if name == "kernel" else (lambda hidden: None)
            results[name].append(run())
            total, step = results[name][-1]
            print(f"round {r} {name}: {total:.2f} s, decode step {1e3 * step:.1f} ms", flush=True)
    for name, runs in results.items():
        print(f"{name}: median {statistics.median(t for t, _ in runs):.2f} s, decode step "
              f"{1e3 * statistics.median(s for _, s in runs):.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["kernel", "engine"], default="kernel")
    parser.add_argument("--rows", nargs="+", type=int, default=[2, 8, 16, 32])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    if int8_dot.load_int8_dot_ops() is None:
        raise SystemExit("the int8 dot kernels do not run here")
    kernel(args.rows, args.rounds) if args.part == "kernel" else engine(args.rounds)


if __name__ == "__main__":
    main()
