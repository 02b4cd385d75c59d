"""w8a8 prefill linears on Gemma 3 270M's shapes: jido's AMX int8 GEMM (``int8_dot.amx_gemm_linear``, and the gate/up
projection with its GELU fused, ``amx_gemm_gated``) against torch._int_mm's route (``int_mm_linear``) and oneDNN's bf16
GEMM on the same weights (plus jido's ``act_and_mul`` for gate/up), same process.

Each variant of a shape runs interleaved with the others, ``--repeats`` rounds; figures are medians in ms. AMX CPUs
only.

    .venv/bin/python benchmarks/int8_gemm.py [--rows 2000 32] [--repeats 21] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from jido.bench.machine import machine_info, now_iso
from jido.layers import int8_dot, quant_kernels
from jido.layers.activation import load_activation_ops

SHAPES = {"qkv": (640, 1536), "o": (1024, 640), "gate_up": (640, 4096), "down": (2048, 640)}  # (K, N)
GELU = 1  # act_and_mul's number for GELU's tanh form, Gemma 3's activation


def variants(rows: int, k: int, n: int, name: str) -> dict[str, Callable[[], torch.Tensor]]:
    gen = torch.Generator().manual_seed(k + n)
    weight = torch.randn(n, k, generator=gen) * 0.05
    w = quant_kernels.quantize(weight, 8, None)
    dense = torch.ops.mkldnn._reorder_linear_weight(weight.bfloat16(), 1)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    bf16 = lambda: torch.ops.mkldnn._linear_pointwise(x, dense, None, "none", [], "")  # noqa: E731
    if name != "gate_up":
        gemm = int8_dot.pack_amx_gemm(w)
        return {"bf16_onednn": bf16, "int_mm": lambda: int8_dot.int_mm_linear(x, w),
                "amx_gemm": lambda: int8_dot.amx_gemm_linear(x, gemm)}
    act = load_activation_ops()
    gated = int8_dot.pack_amx_gemm(w, gated=True)
    return {"bf16_onednn": lambda: act.act_and_mul(bf16(), GELU),
            "int_mm": lambda: act.act_and_mul(int8_dot.int_mm_linear(x, w), GELU),
            "amx_gemm": lambda: int8_dot.amx_gemm_gated(x, gated, GELU)}


def bench(rows: int, repeats: int) -> dict:
    row: dict = {"rows": rows}
    totals: dict[str, float] = {}
    for name, (k, n) in SHAPES.items():
        runs = variants(rows, k, n, name)
        times: dict[str, list[float]] = {v: [] for v in runs}
        for run in runs.values():
            run()
        for _ in range(repeats):
            for v, run in runs.items():
                start = time.perf_counter()
                run()
                times[v].append(1e3 * (time.perf_counter() - start))
        row[name] = {v: round(statistics.median(ts), 3) for v, ts in times.items()}
        for v, ms in row[name].items():
            totals[v] = totals.get(v, 0.0) + ms
    row["layer"] = {v: round(ms, 3) for v, ms in totals.items()}
    row["bf16_over_amx_gemm"] = round(totals["bf16_onednn"] / totals["amx_gemm"], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[2000, 32])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not int8_dot.amx_runs():
        raise SystemExit("jido's AMX int8 GEMM does not run here (no AMX-INT8 tiles, or the kernels did not build)")
    rows = [bench(r, args.repeats) for r in args.rows]
    for row in rows:
        print(json.dumps(row))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": now_iso(), "machine": machine_info(), "torch": torch.__version__, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
