"""Weight-quantized linear kernels on Gemma 3 270M's shapes, against the dense matmul in the same dtype.

Times the layer's dispatch as shipped (``int8`` / ``int4``: groups of 32, what ``QuantizedLinearMethod.apply``
runs: the int8 dot-product kernels where they run, else ``quant_linear``) and each path forced: ``*_rows`` and
``*_panels`` (jido/layers/int8_dot.py: x rounded to int8 per block, integer dot products by the rows kernel or
the panel kernel), ``*_fp32`` (quant_kernels' C++ kernel with fp32 FMAs), ``*_bf16dots`` (its AVX512_BF16
kernel, where the CPU has it), ``*_tiles`` (tiles of rows dequantized, then ``F.linear``); the dense baseline
(oneDNN-packed weight, ``_linear_pointwise``, as jido's unquantized CPU path runs; bf16 only where oneDNN
packs bf16) and torch's own weight-only ops (``_weight_int8pack_mm``, per-channel int8 with bf16 scales;
``_weight_int4pack_mm_for_cpu``, groups of 32 with bf16 scales and zeros), for M rows of x in ``--dtype``
(default: what ``dtype="auto"`` computes in on this CPU). Every figure: min and median in ms of ``--repeats``
timed calls, all variants of a shape interleaved per repeat.

    flock /tmp/jido-bench.lock env PYTHONPATH=. .venv/bin/python benchmarks/quant_kernels.py \\
        [--repeats 15] [--threads 2] [--rows 1,2,4,8,16,32] [--dtype float32] \\
        [--out benchmarks/results/quant_kernels-<date>-<cpu kind>.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from jido.bench.machine import describe_machine, machine_info, now_iso
from jido.layers import int8_dot, quant_kernels as qk
from jido.layers.quantization import pack_dense, packable, packed_linear
from jido.runner.model_loading import resolve_dtype

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}

# Gemma 3 270M: [out_features, in_features] of the LM head and of one layer's projections.
SHAPES = {"lm_head": (262144, 640), "qkv": (1536, 640), "o": (640, 1024), "gate_up": (4096, 640),
          "down": (640, 2048)}


def variants(weight: torch.Tensor, dtype: torch.dtype) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Name -> a function of x computing x weight^T some way; weights are prepared once, outside the timing."""
    ops = qk.load_quant_ops()
    out: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    if packable(weight.to(dtype)):
        packed = pack_dense(weight.to(dtype))
        out[f"dense_{DTYPE_NAMES[dtype]}"] = lambda x: packed_linear(x, packed)
    for bits in (8, 4):
        w = qk.quantize(weight, bits, 32)
        out[f"int{bits}"] = lambda x, w=w: _dispatched(x, w)
        if int8_dot.runs(w):
            out[f"int{bits}_rows"] = lambda x, w=w: int8_dot.int8_dot_linear(x, w, panels=False)
            out[f"int{bits}_panels"] = lambda x, w=w: int8_dot.int8_dot_linear(x, w, panels=True)
        out[f"int{bits}_fp32"] = lambda x, w=w: ops.linear(x, w.data, w.scales, w.mins, w.group_size, w.bits,
                                                           w.shape[1], None)
        if qk.has_bf16_dots() and dtype == torch.bfloat16:
            out[f"int{bits}_bf16dots"] = lambda x, w=w: ops.linear(x, w.data, w.scales, w.mins, w.group_size,
                                                                   w.bits, w.shape[1], None, True)
        out[f"int{bits}_tiles"] = lambda x, w=w: qk._tiled_linear(x, w, None, ops)
    out.update(torch_ops(weight, dtype))
    return out


def _dispatched(x: torch.Tensor, w: qk.QuantizedWeight) -> torch.Tensor:
    """What QuantizedLinearMethod.apply runs for a layer holding ``w`` (int8 / int4 schemes)."""
    if int8_dot.runs(w):
        return int8_dot.int8_dot_linear(x, w)
    return qk.quant_linear(x, w)


def torch_ops(weight: torch.Tensor, dtype: torch.dtype) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """torch's weight-only int8 (per channel) and int4 (groups of 32) matmuls on the same weight, scales in ``dtype``."""
    w8 = qk.quantize(weight, 8, None)
    scales8 = w8.scales[:, 0].to(dtype)
    w4 = qk.quantize(weight, 4, 32)
    q4 = qk.dequantize_reference(qk.QuantizedWeight(w4.data, torch.ones_like(w4.scales), None, 32, 4, w4.shape))
    packed4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4.to(torch.int32), 1)
    # torch's int4 format: w = (q - 8) * scale + zero, so zero = min + 8 * scale; [K // 32, N, 2]
    scale_zeros = torch.stack((w4.scales, w4.mins + 8 * w4.scales), dim=-1).transpose(0, 1).to(dtype)
    return {"torch_int8pack": lambda x: torch.ops.aten._weight_int8pack_mm(x, w8.data, scales8),
            "torch_int4pack": lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed4, 32,
                                                                                  scale_zeros.contiguous())}


def time_all(fns: dict[str, Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor,
             repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn(x)  # warm up: page in the weights, build oneDNN primitives
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn(x)
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,4,8,16,32")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help="x's dtype")
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype, torch.device("cpu"))
    machine = machine_info()
    print(f"# {now_iso()}  {describe_machine(machine)}; {args.threads} threads; "
          f"x in {dtype}; BF16_DOTS_MIN_ROWS={qk.BF16_DOTS_MIN_ROWS}, int8_dot.PANEL_MIN_ROWS={int8_dot.PANEL_MIN_ROWS}")
    records = []
    gen = torch.Generator().manual_seed(0)
    for shape_name in args.shapes.split(","):
        num_out, num_in = SHAPES[shape_name]
        weight = torch.randn(num_out, num_in, generator=gen) * 0.02
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, num_in, generator=gen).to(dtype)
            times = time_all(variants(weight, dtype), x, args.repeats)
            dense = statistics.median(next(iter(times.values())))  # the dense matmul, where oneDNN packs dtype
            for name, ts in times.items():
                med = statistics.median(ts)
                records.append({"shape": shape_name, "N": num_out, "K": num_in, "M": rows, "variant": name,
                                "min_ms": round(min(ts), 3), "median_ms": round(med, 3),
                                "vs_dense_median": round(med / dense, 2)})
                print(f"{shape_name:8s} M={rows:<3d} {name:16s} min {min(ts):8.3f}  median {med:8.3f} ms  "
                      f"x{med / dense:.2f} of dense", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"date": now_iso(), "machine": machine, "threads": args.threads, "dtype": str(dtype),
                       "bf16_dots_min_rows": qk.BF16_DOTS_MIN_ROWS, "int8_dot_panel_min_rows": int8_dot.PANEL_MIN_ROWS,
                       "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
