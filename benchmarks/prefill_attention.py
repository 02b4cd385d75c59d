"""One prompt's prefill attention on Gemma 3 270M's heads, bf16: the C++ kernels (``csrc/flash_prefill.cpp``: on
oneDNN's brgemm, ``cpp``, and where the CPU has AMX-BF16 on jido's own tile code, ``tiles``) against the SDPA path
the tiled backend takes without them (``torch_backend.causal_attention``), same process.

Heads: 4 query heads on 1 KV head of 256, scale 1/16; a 512-token sliding window (15 of the 18 layers) and
full causal attention (3 layers). Both variants run interleaved, ``--repeats`` rounds; figures are the median and
min in ms, and GFLOP/s of the visible scores (2 x 2 x visible pairs x head_dim x heads). The kernel runs even where
jido's dispatch keeps SDPA (AMX), so both are measured on every CPU.

    .venv/bin/python benchmarks/prefill_attention.py [--tokens 2000 8000] [--repeats 15] [--out FILE.json]
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 .venv/bin/python benchmarks/prefill_attention.py   # oneDNN without AMX
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from jido.attention import cpu_extension
from jido.attention.backend import AttentionLayerSpec
from jido.attention.torch_backend import causal_attention
from jido.bench.machine import machine_info, now_iso

HEADS, HEAD_DIM, WINDOW = 4, 256, 512


def visible_gflop(tokens: int, window: int | None) -> float:
    pairs = sum(min(i + 1, window) if window else i + 1 for i in range(tokens))
    return 4 * pairs * HEAD_DIM * HEADS / 1e9


def bench(tokens: int, window: int | None, repeats: int) -> dict:
    kernel = cpu_extension.load_flash_prefill(on_amx=True)
    tiles = cpu_extension.load_tile_prefill()
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(tokens, HEADS, HEAD_DIM, generator=gen).bfloat16()
    keys = torch.randn(1, tokens, HEAD_DIM, generator=gen).bfloat16()
    values = torch.randn(1, tokens, HEAD_DIM, generator=gen).bfloat16()
    spec = AttentionLayerSpec(HEADS, 1, HEAD_DIM, HEAD_DIM**-0.5, window)
    out = torch.empty_like(q)
    variants = {"cpp": lambda: kernel(out, q, keys, values, spec.scale, 0, 0, window or 0, 0.0, 64),
                "sdpa": lambda: causal_attention(spec, q, keys, values, 0, 0)}
    if tiles is not None:  # 16 queries (64 rows) per work item, as the backend runs it
        variants["tiles"] = lambda: tiles(out, q, keys, values, spec.scale, 0, 0, window or 0, 0.0, 16)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for run in variants.values():
        run()
    for _ in range(repeats):
        for name, run in variants.items():
            start = time.perf_counter()
            run()
            times[name].append(1e3 * (time.perf_counter() - start))
    gflop = visible_gflop(tokens, window)
    row = {"tokens": tokens, "window": window}
    for name, ts in times.items():
        median = statistics.median(ts)
        row[name] = {"median_ms": round(median, 2), "min_ms": round(min(ts), 2), "gflops": round(gflop / median * 1e3)}
    row["sdpa_over_cpp"] = round(row["sdpa"]["median_ms"] / row["cpp"]["median_ms"], 2)
    if "tiles" in row:
        row["sdpa_over_tiles"] = round(row["sdpa"]["median_ms"] / row["tiles"]["median_ms"], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[2000])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if cpu_extension.load_flash_prefill(on_amx=True) is None:
        raise SystemExit("the C++ prefill kernel could not be built here (see the warning above)")
    rows = [bench(tokens, window, args.repeats) for tokens in args.tokens for window in (WINDOW, None)]
    result = {"date": now_iso(), "machine": machine_info(), "torch": torch.__version__,
              "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
              "onednn_amx": bool(torch.ops.jido_cpu_prefill.amx()), "rows": rows}
    for row in rows:
        print(json.dumps(row))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
