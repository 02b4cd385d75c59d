"""Attention kernels on Gemma 3 270M's head shapes: the reference ``torch`` backend against ``tiled``.

Heads: 4 query heads, 1 KV head, head_dim 256, scale 1/16, block size 16; full attention (the global
layers) and a 512-token sliding window (five layers in six). Times one layer's ``forward`` (KV write
included), in ms: min and median of ``--repeats`` runs, the variants interleaved within each repeat.
(a) decode: batch 1 and 32 at 256, 2k and 8k tokens of context, float32 and bfloat16; the tiled backend
with its C++ kernel (``cpp``) and with its PyTorch fallback (``tiled-torch``). Blocks are shuffled.
``--kv-cache-dtypes auto int8 fp8_e4m3`` repeats each decode case over quantized caches (queries stay in
the case's dtype; ``auto`` is the case's dtype).
(b) prefill: one 2k, 8k and 32k-token prompt; each case runs in a fresh process that reports its time and
peak resident memory above what it held before the call (``ru_maxrss``). The reference backend at 32k is
skipped when its mask alone would pass ``--max-reference-gib``; its largest intermediates are listed.

    flock /tmp/jido-bench.lock env PYTHONPATH=. .venv/bin/python benchmarks/attention_kernels.py \
        [--repeats 5] [--threads N] [--dtypes bfloat16] [--kv-cache-dtypes auto int8] \
        [--out benchmarks/results/attention_kernels-<date>-<cpu kind>.json]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from jido.attention.backend import AttentionBackend, AttentionLayerSpec, build_common_metadata
from jido.attention.kv_quant import cache_rows, resolve_kv_cache_dtype
from jido.attention.registry import get_attention_backend
from jido.attention.tiled_backend import TiledAttentionBackend
from jido.utils.cpu import cpu_info

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, WINDOW = 4, 1, 256, 16, 512
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _backend(name: str) -> AttentionBackend:
    if name == "tiled-torch":
        return TiledAttentionBackend(use_cpp_decode=False)
    return get_attention_backend("tiled" if name == "cpp" else name)


def make_step(backend: AttentionBackend, query_lens: list[int], seq_lens: list[int], dtype: torch.dtype,
              seed: int = 0, kv_cache_dtype: str = "auto",
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, object]:
    """q, k, v, a cache with random contents over shuffled blocks, and the backend's metadata for one step."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // BLOCK_SIZE) for n in seq_lens]
    ids = torch.randperm(sum(needed), generator=gen).numpy().astype(np.int32) + 1
    table = np.zeros((len(seq_lens), max(needed)), dtype=np.int32)
    start = 0
    for i, n in enumerate(needed):
        table[i, :n] = ids[start : start + n]
        start += n
    cache_dtype = resolve_kv_cache_dtype(kv_cache_dtype, dtype)
    shape = backend.get_kv_cache_shape(sum(needed) + 1, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    kv_cache = cache_rows(torch.randn(shape, generator=gen), cache_dtype)  # quantized rows are HEAD_DIM + 4 wide
    num_tokens = sum(query_lens)
    q = torch.randn(num_tokens, NUM_HEADS * HEAD_DIM, generator=gen).to(dtype)
    k = torch.randn(num_tokens, NUM_KV_HEADS * HEAD_DIM, generator=gen).to(dtype)
    v = torch.randn(num_tokens, NUM_KV_HEADS * HEAD_DIM, generator=gen).to(dtype)
    metadata = backend.build_metadata(build_common_metadata(query_lens, seq_lens, table, BLOCK_SIZE))
    return q, k, v, kv_cache, metadata


def _spec(window: int | None) -> AttentionLayerSpec:
    return AttentionLayerSpec(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5, window)


@torch.inference_mode()
def bench_decode(repeats: int, dtypes: list[str], kv_cache_dtypes: list[str]) -> list[dict]:
    rows = []
    for dtype_name in dtypes:
        for window in (None, WINDOW):
            for batch in (1, 32):
                for context in (256, 2048, 8192):
                    for kv in kv_cache_dtypes:
                        rows.append(_decode_case(dtype_name, window, batch, context, repeats, kv))
                        print(json.dumps(rows[-1]), flush=True)
    return rows


def _decode_case(dtype_name: str, window: int | None, batch: int, context: int, repeats: int,
                 kv_cache_dtype: str) -> dict:
    variants = ["torch", "tiled-torch", "cpp"]
    steps = {}
    for name in variants:
        backend = _backend(name)
        steps[name] = (backend, make_step(backend, [1] * batch, [context] * batch, DTYPES[dtype_name],
                                          kv_cache_dtype=kv_cache_dtype))
    times: dict[str, list[float]] = {name: [] for name in variants}
    spec = _spec(window)
    for _ in range(repeats + 1):  # the first round warms up (and builds the C++ kernel)
        for name, (backend, step) in steps.items():
            start = time.perf_counter()
            backend.forward(spec, *step)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {"kind": "decode", "dtype": dtype_name, "kv_cache_dtype": kv_cache_dtype, "window": window,
            "batch": batch, "context": context,
            **{f"{name}_ms": _summary(t[1:]) for name, t in times.items()}}


def _summary(times: list[float]) -> dict:
    return {"min": round(min(times), 3), "median": round(statistics.median(times), 3)}


@torch.inference_mode()
def prefill_case(backend_name: str, seq_len: int, window: int | None, dtype_name: str) -> dict:
    """One prefill timed in this process: seconds and peak resident memory above what was held before."""
    backend = _backend(backend_name)
    step = make_step(backend, [seq_len], [seq_len], DTYPES[dtype_name])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    backend.forward(_spec(window), *step)
    seconds = time.perf_counter() - start
    peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    return {"kind": "prefill", "backend": backend_name, "seq_len": seq_len, "window": window, "dtype": dtype_name,
            "seconds": round(seconds, 3), "peak_extra_mib": round(peak_mib, 1)}


def reference_intermediates_gib(seq_len: int) -> dict:
    """The reference prefill's largest tensors for one prompt: its boolean mask repeated per grouped head
    (``[group * seq_len, seq_len]``) and, with a soft-cap, the float32 scores."""
    group = NUM_HEADS // NUM_KV_HEADS
    return {"mask_gib": round(group * seq_len * seq_len / 2**30, 2),
            "softcap_scores_gib": round(4 * NUM_KV_HEADS * group * seq_len * seq_len / 2**30, 2)}


def bench_prefill(max_reference_gib: float) -> list[dict]:
    rows = []
    for dtype_name in DTYPES:
        for seq_len, window in ((2048, None), (8192, None), (32768, None), (8192, WINDOW), (32768, WINDOW)):
            for backend in ("torch", "tiled"):
                if backend == "torch" and reference_intermediates_gib(seq_len)["mask_gib"] > max_reference_gib:
                    row = {"kind": "prefill", "backend": backend, "seq_len": seq_len, "window": window,
                           "dtype": dtype_name, "skipped": reference_intermediates_gib(seq_len)}
                else:
                    cmd = [sys.executable, __file__, "--prefill-case", backend, str(seq_len), str(window or 0),
                           dtype_name]
                    row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--only", choices=["decode", "prefill"], default=None)
    parser.add_argument("--max-reference-gib", type=float, default=2.0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--kv-cache-dtypes", nargs="+", default=["auto"], help="decode caches: auto, int8, ...")
    parser.add_argument("--prefill-case", nargs=4, metavar=("BACKEND", "SEQ_LEN", "WINDOW", "DTYPE"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.prefill_case:
        backend, seq_len, window, dtype_name = args.prefill_case
        print(json.dumps(prefill_case(backend, int(seq_len), int(window) or None, dtype_name)))
        return
    result = {"cpu": cpu_info().as_dict(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    print(json.dumps(result), flush=True)
    if args.only in (None, "decode"):
        result["decode"] = bench_decode(args.repeats, args.dtypes, args.kv_cache_dtypes)
    if args.only in (None, "prefill"):
        result["prefill"] = bench_prefill(args.max_reference_gib)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
