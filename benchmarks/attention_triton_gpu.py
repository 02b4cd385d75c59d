"""The triton backend's attention kernel against PyTorch SDPA on dense tensors: TFLOP/s, % of peak, correctness.

Shapes (Llama-3-8B-like heads: 32 query heads, 8 KV heads, head_dim 128, block size 16):
prefill 1 x 8k and 8 x 2k tokens (causal, no prefix); decode batch 1, 32 and 128 at 2k and 8k context.
For each shape: the triton kernel reads a paged cache through shuffled block tables; SDPA
(``F.scaled_dot_product_attention``, PyTorch's pick of kernel) reads the same K/V as dense
``[batch, heads, len, head_dim]`` tensors. Both count the same useful FLOPs (4 * head_dim * heads per
visible query-key pair). Decode also reports the KV cache bandwidth (it is memory-bound). Every shape is
first checked against float32 SDPA on the dense K/V (max abs error). Peaks: H200 bf16 dense 989
TFLOP/s, HBM 4.8 TB/s.

    PYTHONPATH=. python benchmarks/attention_triton_gpu.py [--dtype bfloat16] [--iters 20] [--out FILE.md]
    PYTHONPATH=. python benchmarks/attention_triton_gpu.py --device cpu --tiny   # correctness only, interpreted
    PYTHONPATH=. python benchmarks/attention_triton_gpu.py --sweep   # prefill: every tile and launch setting

``--sweep`` times the prefill shapes under each large-tile size (rows x keys), warp count and pipeline depth
(``triton_backend.LARGE_TILES`` and ``PREFILL_LAUNCH``), each checked against float32 SDPA first.
"""
from __future__ import annotations

import argparse
import itertools
import os
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from jido.attention.backend import AttentionLayerSpec, build_common_metadata

H200_BF16_DENSE_TFLOPS = 989.0
H200_HBM_TBPS = 4.8


@dataclass(frozen=True)
class Shape:
    name: str
    requests: list[tuple[int, int]]  # (cached prefix length, query length) per request


def shapes(tiny: bool) -> list[Shape]:
    if tiny:
        return [Shape("prefill 1x40", [(0, 40)]), Shape("prefill 2x24", [(0, 24)] * 2),
                Shape("decode 1@33", [(32, 1)]), Shape("decode 3@70", [(69, 1)] * 3)]
    prefills = [Shape("prefill 1x8k", [(0, 8192)]), Shape("prefill 8x2k", [(0, 2048)] * 8)]
    decodes = [Shape(f"decode {b}@{c // 1024}k", [(c - 1, 1)] * b) for b in (1, 32, 128) for c in (2048, 8192)]
    return prefills + decodes


SWEEP = {"tiles": [(64, 64), (128, 32), (128, 64)], "num_warps": [4, 8], "num_stages": [2, 3]}


def runs(tiny: bool, sweep: bool) -> list[tuple[Shape, dict | None]]:
    """(shape, setting): every shape as shipped, or each prefill shape under every setting of the sweep."""
    if not sweep:
        return [(shape, None) for shape in shapes(tiny)]
    settings = [{"tiles": t, "num_warps": w, "num_stages": s}
                for t, w, s in itertools.product(SWEEP["tiles"], SWEEP["num_warps"], SWEEP["num_stages"])]
    return [(shape, setting) for shape in shapes(tiny) if shape.name.startswith("prefill") for setting in settings]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="small shapes and heads (for --device cpu)")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    parser.add_argument("--sweep", action="store_true", help="prefill shapes under every tile and launch setting")
    args = parser.parse_args()
    if args.device == "cpu":
        # Triton reads this once, when it is imported (below): CPU tensors need its interpreter.
        os.environ["TRITON_INTERPRET"] = "1"
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    heads, kv_heads, head_dim, block_size = (4, 2, 16, 4) if args.tiny else (32, 8, 128, 16)
    spec = AttentionLayerSpec(heads, kv_heads, head_dim, head_dim**-0.5)
    lines = [f"# triton attention vs SDPA: {_device_name(args.device)}, {dtype}, {heads}/{kv_heads} heads x "
             f"{head_dim}, block size {block_size}", "",
             "| shape | max err | triton ms | TFLOP/s | % peak | KV GB/s (% HBM) | SDPA ms | SDPA TFLOP/s | % peak |",
             "|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for shape, setting in runs(args.tiny, args.sweep):
        try:
            line = run_shape(shape, spec, block_size, dtype, args.device, args.iters, setting)
        except Exception as error:  # a setting the GPU cannot run (shared memory, registers) must not end the sweep
            if setting is None:
                raise
            line = f"| {shape.name} {setting} | {type(error).__name__}: {str(error)[:80]} | - | - | - | - | - | - | - |"
        print(line, flush=True)
        lines.append(line)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    if any("WRONG" in line for line in lines):
        raise SystemExit("the triton kernel disagrees with the reference on a shape marked WRONG")


def run_shape(shape: Shape, spec: AttentionLayerSpec, block_size: int, dtype: torch.dtype, device: str,
              iters: int, setting: dict | None = None) -> str:
    # Imported here, after main() has chosen whether triton interprets.
    from jido.attention import triton_backend
    from jido.attention.triton_backend import TritonAttentionBackend, num_kv_splits, unified_attention

    if setting is not None:
        triton_backend.LARGE_TILES = setting["tiles"]
        triton_backend.PREFILL_LAUNCH = {"num_warps": setting["num_warps"], "num_stages": setting["num_stages"]}
        shape = Shape(f"{shape.name} tiles {setting['tiles']} warps {setting['num_warps']} stages "
                      f"{setting['num_stages']}", shape.requests)

    gen = torch.Generator(device).manual_seed(0)
    num_reqs, (prefix, query_len) = len(shape.requests), shape.requests[0]
    seq_len = prefix + query_len
    # Dense K/V [batch, kv_heads, seq_len, head_dim] and queries [batch, heads, query_len, head_dim].
    k = torch.randn(num_reqs, spec.num_kv_heads, seq_len, spec.head_dim, generator=gen, device=device).to(dtype)
    v = torch.randn(num_reqs, spec.num_kv_heads, seq_len, spec.head_dim, generator=gen, device=device).to(dtype)
    q = torch.randn(num_reqs, spec.num_heads, query_len, spec.head_dim, generator=gen, device=device).to(dtype)
    backend = TritonAttentionBackend()
    blocks_per_req = -(-seq_len // block_size)
    table = np.random.default_rng(0).permutation(num_reqs * blocks_per_req).reshape(num_reqs, blocks_per_req)
    cache = torch.zeros(backend.get_kv_cache_shape(table.size, block_size, spec.num_kv_heads, spec.head_dim),
                        dtype=dtype, device=device)
    # Fill the cache through its block tables: [num_blocks, block_size, kv_heads, head_dim] per K and V.
    padded = blocks_per_req * block_size
    for i, dense in enumerate((k, v)):
        rows = F.pad(dense, (0, 0, 0, padded - seq_len)).transpose(1, 2)  # [batch, padded, kv_heads, head_dim]
        cache[i][torch.from_numpy(table.reshape(-1)).to(device)] = rows.reshape(-1, block_size, *rows.shape[2:])
    common = build_common_metadata([query_len] * num_reqs, [seq_len] * num_reqs, table.astype(np.int32),
                                   block_size, device)
    metadata = backend.build_metadata(common)
    flat_q = q.transpose(1, 2).reshape(num_reqs * query_len, -1)  # [num_tokens, heads * head_dim]
    out = torch.full_like(flat_q, float("nan"))
    splits = num_kv_splits(metadata, spec.num_kv_heads, torch.device(device))
    unified_attention(spec, flat_q, cache, out, metadata, splits)
    expected = _sdpa(q.float(), k.float(), v.float(), query_len).transpose(1, 2).reshape(out.shape)
    err = (out.float() - expected).abs().max().item()
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    err_text = f"{err:.1e}" if err <= tolerance else f"{err:.1e} WRONG"  # NaN compares False: WRONG too
    if device == "cpu":
        return f"| {shape.name} | {err_text} | - | - | - | - | - | - | - |"
    pairs = num_reqs * (query_len * (query_len + 1) // 2 if prefix == 0 else seq_len)
    flops = 4 * spec.head_dim * spec.num_heads * pairs
    kv_bytes = 2 * k.numel() * k.element_size()
    triton_s = cuda_time(lambda: unified_attention(spec, flat_q, cache, out, metadata, splits), iters)
    sdpa_s = cuda_time(lambda: _sdpa(q, k, v, query_len), iters)
    tflops, sdpa_tflops = flops / triton_s / 1e12, flops / sdpa_s / 1e12
    return (f"| {shape.name} | {err_text} | {triton_s * 1e3:.3f} | {tflops:.1f} | "
            f"{100 * tflops / H200_BF16_DENSE_TFLOPS:.1f} | {kv_bytes / triton_s / 1e9:.0f} "
            f"({100 * kv_bytes / triton_s / 1e12 / H200_HBM_TBPS:.0f}%) | {sdpa_s * 1e3:.3f} | "
            f"{sdpa_tflops:.1f} | {100 * sdpa_tflops / H200_BF16_DENSE_TFLOPS:.1f} |")


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_len: int) -> torch.Tensor:
    # Prefill from an empty cache is plain causal; a decode's one query sees every key.
    return F.scaled_dot_product_attention(q, k, v, is_causal=query_len > 1, enable_gqa=True)


def cuda_time(fn, iters: int, warmup: int = 3) -> float:
    """Median seconds per call, by CUDA events, after ``warmup`` calls (compiles and autotunes)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return float(np.median(times))


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else f"cpu (interpreted), {time.ctime()}"


if __name__ == "__main__":
    main()
