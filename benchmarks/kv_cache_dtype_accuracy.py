"""How far a quantized KV cache moves Gemma 3 270M's greedy output from the float cache, on the test fixture's prompts.

For every fixture prompt the engine (``--dtype``, default ``auto``; the default backend) decodes greedily with
``kv_cache_dtype`` auto and with each quantized format, top-20 logprobs per step. Reported per format: the
tokens that match auto's up to the first divergence, whole generations that match, and the error in the gap
between auto's top two tokens along the agreeing steps (as ``bf16_accuracy.py`` measures bf16 against float32).

    flock /tmp/jido-bench.lock env PYTHONPATH=. .venv/bin/python benchmarks/kv_cache_dtype_accuracy.py
"""
from __future__ import annotations

import argparse
import json

import torch
from bf16_accuracy import FIXTURE, RESULTS, decode, gap_errors

from jido import LLM
from jido.bench.machine import cpu_kind, machine_info, now_iso


def compare(reference: list, quantized: list) -> dict:
    """Agreement of one quantized run with the auto run on one prompt."""
    ids_ref, ids_q = [t for t, _ in reference], [t for t, _ in quantized]
    diverge = next((i for i, (a, b) in enumerate(zip(ids_ref, ids_q)) if a != b), None)
    errors = gap_errors(reference, quantized)
    return {"first_divergence": diverge, "agreeing_tokens": len(ids_ref) if diverge is None else diverge,
            "max_gap_error": round(max(errors), 4), "median_gap_error": round(sorted(errors)[len(errors) // 2], 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kv-cache-dtypes", nargs="+", default=["int8", "fp8_e4m3", "fp8_e5m2"])
    parser.add_argument("--dtype", default="auto", help="the model's dtype in every run")
    args = parser.parse_args()
    generations = json.loads(FIXTURE.read_text(encoding="utf-8"))["generations"]
    llms = {kv: LLM(dtype=args.dtype, kv_cache_memory="160MiB", kv_cache_dtype=kv)
            for kv in ["auto", *args.kv_cache_dtypes]}
    rows = []
    for gen in generations:
        steps = len(gen["output_ids"])
        runs = {kv: decode(llm, gen["prompt_ids"], steps) for kv, llm in llms.items()}
        row = {"name": gen["name"], "prompt_tokens": len(gen["prompt_ids"]), "steps": steps,
               **{kv: compare(runs["auto"], runs[kv]) for kv in args.kv_cache_dtypes}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {kv: {"agreeing_tokens": sum(r[kv]["agreeing_tokens"] for r in rows),
                    "tokens": sum(r["steps"] for r in rows),
                    "identical_generations": sum(r[kv]["first_divergence"] is None for r in rows),
                    "max_gap_error": max(r[kv]["max_gap_error"] for r in rows)} for kv in args.kv_cache_dtypes}
    dtype = str(llms["auto"].llm_engine.collective_rpc(_dtype)[0])
    result = {"date": now_iso(), "machine": machine_info() | {"torch": torch.__version__}, "model_dtype": dtype,
              "prompts": rows, "summary": summary}
    path = RESULTS / f"kv_cache_dtype_accuracy-{result['date'][:10]}-{cpu_kind()}-{dtype.removeprefix('torch.')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=1))
    print(f"wrote {path}")


def _dtype(worker) -> torch.dtype:
    return worker.runner.dtype


if __name__ == "__main__":
    main()
