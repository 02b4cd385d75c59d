"""One engine step, timed per attention backend, precision and KV cache dtype in the same run: batch-1 and
batch-32 decode.

For each configuration the engine prefills ``--batch`` prompts of ``--context`` tokens (Gemma 3 270M, the
default model), then times ``--steps`` decode steps and reports the median step and its split (schedule,
prepare, model, sample, update, from the engine's own iteration records). Configurations run interleaved,
``--repeats`` rounds, so drift on a shared machine hits them alike; every figure is the median over rounds.
Each row also records the KV capacity of its configuration in ``--kv-cache-memory``: blocks, tokens, and the
maximum concurrency the engine logs.

    .venv/bin/python benchmarks/decode_step.py --backends torch tiled --dtypes auto float32
    .venv/bin/python benchmarks/decode_step.py --backends tiled --kv-cache-dtypes auto int8 fp8_e4m3
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import torch

from jido import LLM, SamplingParams
from jido.bench.machine import cpu_kind, machine_info, now_iso

RESULTS = Path(__file__).parent / "results"
PHASES = ("schedule", "prepare", "model", "sample", "update")


def time_decode(llm: LLM, batch: int, context: int, steps: int) -> dict:
    """Median decode step of ``batch`` requests whose contexts are ``context`` tokens, and its split."""
    engine = llm.llm_engine
    engine.reset_prefix_cache()
    # Room for every request to be decoding at once: chunked prefill finishes the prompts some steps apart, and the
    # first ones decode meanwhile (with only steps + 2 tokens, a short run's first requests ended before the last
    # began and the wait below never ended). What is left after the timed steps is aborted.
    params = SamplingParams(temperature=0, max_tokens=steps + 2 + batch * context, ignore_eos=True)
    request_ids = [f"step-{time.perf_counter_ns()}-{i}" for i in range(batch)]
    for i, request_id in enumerate(request_ids):
        # Distinct prompts (no prefix-cache hits): token ids cycle through the vocabulary's ordinary range.
        prompt = [2] + [1000 + (i * 7919 + j * 31) % 200000 for j in range(context - 1)]
        engine.add_request(request_id, prompt, params)
    while engine.get_scheduler_stats().num_waiting or not _all_decoding(engine, batch):
        engine.step()
    times, split = [], {p: [] for p in PHASES}
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
        stats = engine.last_iteration_stats
        for phase in PHASES:
            split[phase].append(getattr(stats, f"{phase}_s", 0.0))  # older versions lack "prepare"
    engine.abort_request(request_ids)
    while engine.has_unfinished_requests():
        engine.step()
    return {"step_ms": 1e3 * statistics.median(times),
            **{f"{p}_ms": 1e3 * statistics.median(v) for p, v in split.items()}}


def _all_decoding(engine, batch: int) -> bool:
    stats = engine.last_iteration_stats
    return stats is not None and stats.num_tokens == batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["torch", "tiled"], help="attention backends to compare")
    parser.add_argument("--dtypes", nargs="+", default=["auto"], help="precisions to compare (auto, float32, ...)")
    parser.add_argument("--kv-cache-dtypes", nargs="+", default=["auto"], help="KV cache dtypes (auto, int8, ...)")
    parser.add_argument("--kv-cache-memory", default="2GiB", help="KV cache size of every configuration")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32], help="decode batch sizes")
    parser.add_argument("--context", type=int, default=1024, help="tokens of context per request")
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed per configuration and round")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each figure is the median over them")
    parser.add_argument("--tag", default="", help="appended to the result file's name")
    args = parser.parse_args()
    configs = list(itertools.product(args.dtypes, args.backends, args.kv_cache_dtypes))
    llms = {c: LLM(dtype=c[0], attention_backend=c[1], kv_cache_dtype=c[2], kv_cache_memory=args.kv_cache_memory,
                   max_model_len=args.context + 64, max_num_seqs=max(args.batches)) for c in configs}
    rounds: dict[tuple, list[dict]] = {(c, b): [] for c in configs for b in args.batches}
    for r in range(args.repeats):
        for (config, batch) in rounds:
            rounds[(config, batch)].append(time_decode(llms[config], batch, args.context, args.steps))
            print(f"round {r + 1}: {config} batch {batch}: {rounds[(config, batch)][-1]['step_ms']:.1f} ms", flush=True)
    rows = []
    for (config, batch), runs in rounds.items():
        dtype = str(llms[config].llm_engine.collective_rpc(_dtype)[0])
        rows.append({"dtype": config[0], "resolved_dtype": dtype, "backend": config[1], "kv_cache_dtype": config[2],
                     "batch": batch, **_kv_capacity(llms[config]),
                     **{k: statistics.median(run[k] for run in runs) for k in runs[0]},
                     "step_ms_runs": [run["step_ms"] for run in runs]})
    result = {"date": now_iso(), "machine": machine_info() | {"torch": torch.__version__,
                                                              "torch_threads": torch.get_num_threads()},
              "context": args.context, "steps": args.steps, "repeats": args.repeats,
              "kv_cache_memory": args.kv_cache_memory, "rows": rows}
    path = RESULTS / f"decode_step-{result['date'][:10]}-{cpu_kind(result['machine'])}{args.tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for row in rows:
        print(f"{row['resolved_dtype']:>9} {row['backend']:>6} kv {row['kv_cache_dtype']:>8} batch {row['batch']:>3}: "
              f"step {row['step_ms']:.1f} ms " + " ".join(f"{p} {row[f'{p}_ms']:.1f}" for p in PHASES)
              + f"; KV {row['kv_tokens']} tokens")
    print(f"wrote {path}")


def _kv_capacity(llm: LLM) -> dict:
    """The pool's blocks and tokens, and the concurrency at max_model_len the engine logged at startup."""
    plan = llm.llm_engine.core.kv_plan
    kv = plan.kv_cache_config
    return {"kv_blocks": kv.num_blocks, "kv_tokens": kv.num_blocks * kv.block_size, "kv_block_bytes": kv.block_bytes,
            "max_concurrency": round(plan.max_concurrency, 2)}


def _dtype(worker) -> torch.dtype:
    return worker.runner.dtype


if __name__ == "__main__":
    main()
