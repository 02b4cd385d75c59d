"""Decode steps on prepacked panels against the kernels they replaced, in the same run and the same engine.

The default model (Gemma 3 270M's GGUF, `gguf` codes) decodes ``--batches`` requests of ``--context`` tokens;
each figure is the median step of ``--steps`` decode steps (``decode_step.time_decode``). ``prepacked`` is jido
as shipped: steps of two rows or more run on panels packed once at load (``int8_dot.PackedPanels``).
``per_call`` sets ``int8_dot.PREPACKED_MIN_ROWS`` out of reach, which is the dispatch before them: the rows
kernel below 8 rows, the panel kernel packing every weight on every call from 8. Both modes run in every round, batches
interleaved, so drift on a shared machine hits them alike; figures are medians over ``--repeats`` rounds.

    flock /tmp/jido-bench.lock env PYTHONPATH=. .venv/bin/python benchmarks/prepacked_panels.py \\
        [--batches 1 2 4 8 16] [--repeats 3] [--out benchmarks/results/prepacked_panels-<date>-<cpu kind>.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from decode_step import time_decode

from jido import LLM
from jido.bench.machine import cpu_kind, machine_info, now_iso
from jido.layers import int8_dot
from jido.runner.model_loading import weight_bytes

RESULTS = Path(__file__).parent / "results"
MODES = {"prepacked": int8_dot.PREPACKED_MIN_ROWS, "per_call": 2**31}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    llm = LLM(kv_cache_memory="1GiB", max_model_len=args.context + 64, max_num_seqs=max(args.batches))
    runs: dict[tuple[str, int], list[float]] = {(m, b): [] for b in args.batches for m in MODES}
    for r in range(args.repeats):
        for mode, batch in runs:
            int8_dot.PREPACKED_MIN_ROWS = MODES[mode]
            runs[(mode, batch)].append(time_decode(llm, batch, args.context, args.steps)["step_ms"])
            print(f"round {r + 1}: {mode} batch {batch}: {runs[(mode, batch)][-1]:.1f} ms", flush=True)
    int8_dot.PREPACKED_MIN_ROWS = MODES["prepacked"]
    rows = [{"batch": b, **{f"{m}_ms": statistics.median(runs[(m, b)]) for m in MODES},
             **{f"{m}_runs": runs[(m, b)] for m in MODES}} for b in args.batches]
    for row in rows:
        row["speedup"] = row["per_call_ms"] / row["prepacked_ms"]
        print(f"batch {row['batch']:>3}: prepacked {row['prepacked_ms']:.1f} ms, per call {row['per_call_ms']:.1f} ms, "
              f"{row['speedup']:.2f}x")
    model = llm.llm_engine.core.executor.worker.runner.model
    result = {"date": now_iso(), "machine": machine_info() | {"torch": torch.__version__,
                                                              "torch_threads": torch.get_num_threads()},
              "context": args.context, "steps": args.steps, "repeats": args.repeats,
              "weight_bytes": weight_bytes(model),
              "weight_bytes_without_panels": weight_bytes(model, prepacked=False), "rows": rows}
    out = Path(args.out) if args.out else RESULTS / f"prepacked_panels-{result['date'][:10]}-{cpu_kind()}.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
