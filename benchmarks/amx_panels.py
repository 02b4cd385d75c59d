"""Decode steps on the AMX tile panels against the AVX-512 VNNI vector panels, in the same run and the same engine.

The default model (Gemma 3 270M's GGUF, `gguf` codes, default dtype) decodes ``--batches`` requests of ``--context``
tokens; each figure is the median step of ``--steps`` decode steps (``decode_step.time_decode``). ``amx`` is jido
as shipped on a CPU with AMX-INT8: every quantized layer's prepacked panels (``int8_dot.PackedPanels``) in 16-row
tiles, whose layers multiply their bf16 copies from 40 rows (``BF16_COPY_MIN_ROWS_AMX``). ``vector`` repacks the
same codes as the vector kernels' 8-row panels, the bf16 copies from 16 rows (what such a CPU ran before). Both
modes run in every round, batches interleaved, so drift on a shared machine hits them alike; figures are medians
over ``--repeats`` rounds.

    flock /tmp/jido-bench.lock env PYTHONPATH=. .venv/bin/python benchmarks/amx_panels.py \\
        [--batches 2 4 8 16 32] [--repeats 3] [--out benchmarks/results/amx_panels-<date>-<cpu kind>.json]
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
from jido.layers import int8_dot, quantized_linear
from jido.layers.quantized_layouts import layouts_of

RESULTS = Path(__file__).parent / "results"
MODES = ("amx", "vector")


def panel_sets(model: torch.nn.Module) -> dict[str, list[tuple[torch.nn.Module, int8_dot.PackedPanels, int]]]:
    """Each mode's panels for every module that holds prepacked panels, with the rows from which a layer's bf16 copy
    takes over (quantized_linear.BF16_COPY_MIN_ROWS and _AMX)."""
    modules = [m for m in model.modules() if layouts_of(m) is not None and m.layouts.panels is not None]
    return {"amx": [(m, m.layouts.panels, quantized_linear.BF16_COPY_MIN_ROWS_AMX) for m in modules],
            "vector": [(m, int8_dot.pack_panels(m.qweight, m.layouts.panels.per_token, amx=False),
                        quantized_linear.BF16_COPY_MIN_ROWS) for m in modules]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[2, 4, 8, 16, 32])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    if not int8_dot.amx_runs():
        raise SystemExit("this CPU (or process) has no AMX-INT8 tiles: nothing to compare")
    llm = LLM(kv_cache_memory="1GiB", max_model_len=args.context + 64, max_num_seqs=max(args.batches))
    sets = panel_sets(llm.llm_engine.core.executor.worker.runner.model)
    runs: dict[tuple[str, int], list[float]] = {(m, b): [] for b in args.batches for m in MODES}
    for r in range(args.repeats):
        for mode, batch in runs:
            for module, panels, min_rows in sets[mode]:
                module.layouts.panels = panels  # read at each call (quantized_linear's _bind and apply)
                module.layouts.bf16_copy_min_rows = min_rows
            runs[(mode, batch)].append(time_decode(llm, batch, args.context, args.steps)["step_ms"])
            print(f"round {r + 1}: {mode} batch {batch}: {runs[(mode, batch)][-1]:.1f} ms", flush=True)
    rows = [{"batch": b, **{f"{m}_ms": statistics.median(runs[(m, b)]) for m in MODES},
             **{f"{m}_runs": runs[(m, b)] for m in MODES}} for b in args.batches]
    for row in rows:
        row["speedup"] = row["vector_ms"] / row["amx_ms"]
        print(f"batch {row['batch']:>3}: amx {row['amx_ms']:.1f} ms, vector {row['vector_ms']:.1f} ms, "
              f"{row['speedup']:.2f}x")
    result = {"date": now_iso(), "machine": machine_info() | {"torch": torch.__version__,
                                                              "torch_threads": torch.get_num_threads()},
              "context": args.context, "steps": args.steps, "repeats": args.repeats, "rows": rows}
    out = Path(args.out) if args.out else RESULTS / f"amx_panels-{result['date'][:10]}-{cpu_kind()}.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
