"""The ``triton`` attention backend: Triton kernels for the KV write and unified paged attention, for GPUs."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import triton
from triton.runtime.jit import JITFunction

from jido.attention.backend import AttentionBackend, AttentionLayerSpec, AttentionMetadata
from jido.attention.kv_quant import is_quantized, quantize_rows, row_width
from jido.attention.triton_kernels import merge_splits_kernel, reshape_and_cache_kernel, unified_attention_kernel
from jido.utils.host_copy import to_device

# (rows of one query tile: queries x the query heads of one KV head, keys per inner step): small tiles
# waste no rows on decodes and short chunks, large ones reuse each loaded key over more queries in a
# prefill. tl.dot needs 16 or more in each dimension on a GPU.
SMALL_TILES = (16, 32)
LARGE_TILES = (64, 64)
# Warps and software-pipeline stages of a launch with large tiles: swept on an H200 (benchmarks/results/
# gpu_session-2026-12-04-h200-second.md), 4 warps and 2 stages were fastest or close to it on both prefill shapes
# (1 x 8k, 8 x 2k tokens, 32/8 heads of 128), ahead of Triton's default 3 stages and of 8 warps.
PREFILL_LAUNCH = {"num_warps": 4, "num_stages": 2}
# A KV split should get at least this many keys, or the merge costs more than the parallelism buys.
MIN_KEYS_PER_SPLIT = 256
MAX_KV_SPLITS = 16
# The kernel's KV_FORMAT per quantized cache dtype (0: float rows).
KV_FORMATS = {torch.int8: 1, torch.float8_e4m3fn: 2, torch.float8_e5m2: 3}


@dataclass
class TritonAttentionMetadata:
    """One step of one KV cache group: the common metadata and its query tiles, built once per tile height."""

    common: AttentionMetadata
    max_seq_len: int
    max_query_len: int
    # block_q -> (request index, first query within the request) per query tile, on the device
    tiles: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def query_tiles(self, block_q: int) -> tuple[torch.Tensor, torch.Tensor]:
        if block_q not in self.tiles:
            self.tiles[block_q] = _query_tiles(self.common.query_lens_list, block_q, self.common.seq_lens.device)
        return self.tiles[block_q]


class TritonAttentionBackend(AttentionBackend):
    """Paged attention in Triton: one kernel for prefill, prefill chunks, decodes and mixed batches.

    Each program takes a tile of one request's queries for one KV head (all query heads of the group
    together), walks the request's block table a tile of keys at a time with the online softmax, and
    writes the normalized rows. Decode batches too small to fill the GPU split each request's keys over
    several programs and merge the splits by their log-sum-exp (flash-decoding).

    Layout: one tensor per layer, ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (0 keys, 1 values),
    the same as the torch backend's; a quantized cache's rows are ``head_dim + 4`` wide (values, then their
    float32 scale's bytes): the write quantizes in PyTorch and the kernel scatters the bytes, attention reads
    the values and scales in place. The kernels read only visible keys, so the cache may hold anything
    elsewhere. On CPU tensors the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1``,
    set before triton is imported): slow, and meant for tests.
    """

    name = "triton"
    # Query tiles are built (host to device) on the first call with a metadata and cached in it; the split count
    # comes from its Python fields; the kernels skip negative slots and read contexts from seq_lens.
    supports_cuda_graphs = True

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                           dtype: torch.dtype | None = None) -> tuple[int, ...]:
        if dtype is not None and is_quantized(dtype) and head_dim % 4:
            raise ValueError(f"the triton backend reads a quantized KV cache's float32 scales in place, which needs "
                             f"head_dim divisible by 4 (got {head_dim}); use kv_cache_dtype='auto'")
        return (2, num_blocks, block_size, num_kv_heads, row_width(head_dim, dtype))

    def build_metadata(self, common: AttentionMetadata) -> TritonAttentionMetadata:
        return TritonAttentionMetadata(common, max(common.seq_lens_list), max(common.query_lens_list))

    def forward(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: TritonAttentionMetadata,
    ) -> torch.Tensor:
        reshape_and_cache(k, v, kv_cache, metadata.common.slot_mapping)
        out = torch.empty_like(q)
        splits = num_kv_splits(metadata, spec.num_kv_heads, q.device)
        unified_attention(spec, q, kv_cache, out, metadata, splits)
        return out


def reshape_and_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter this step's key and value rows ``[num_tokens, num_kv_heads * head_dim]`` into their slots
    (quantized, with their scales, if the cache is).

    A negative slot (a padding token) is skipped.
    """
    _check_device(kv_cache)
    if is_quantized(kv_cache.dtype):
        # Quantized here, one reduction per (token, KV head); the kernel then copies bytes.
        shape = (k.shape[0], kv_cache.shape[3], -1)  # [num_tokens, num_kv_heads, head_dim]
        k = quantize_rows(k.reshape(shape), kv_cache.dtype).view(torch.uint8).flatten(1)
        v = quantize_rows(v.reshape(shape), kv_cache.dtype).view(torch.uint8).flatten(1)
        kv_cache = kv_cache.view(torch.uint8)
    k, v = _rows_contiguous(k), _rows_contiguous(v)
    width = kv_cache.shape[3] * kv_cache.shape[4]
    reshape_and_cache_kernel[(k.shape[0],)](
        k, v, kv_cache, slot_mapping, k.stride(0), v.stride(0), kv_cache.stride(0), kv_cache.stride(1),
        kv_cache.stride(2), BLOCK_SIZE=kv_cache.shape[2], ROW_WIDTH=width, ROW_WIDTH_PAD=triton.next_power_of_2(width))


def unified_attention(spec: AttentionLayerSpec, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor,
                      metadata: TritonAttentionMetadata, num_splits: int = 1) -> None:
    """Write causal attention of ``q`` ``[num_tokens, num_heads * head_dim]`` over the cache into ``out``.

    ``num_splits > 1`` divides each query tile's keys over that many programs and merges their outputs.
    """
    _check_device(kv_cache)
    q = _rows_contiguous(q)
    common = metadata.common
    group = spec.num_heads // spec.num_kv_heads
    large = metadata.max_query_len * group >= LARGE_TILES[0]
    block_m, tile_n = LARGE_TILES if large else SMALL_TILES
    block_m = max(block_m, triton.next_power_of_2(group))
    block_q = block_m // group
    tile_req, tile_q_start = metadata.query_tiles(block_q)
    head_dim_pad = max(16, triton.next_power_of_2(spec.head_dim))
    num_tokens = q.shape[0]
    if num_splits > 1:
        partial = torch.empty(num_splits, num_tokens, spec.num_heads, spec.head_dim, dtype=torch.float32,
                              device=q.device)
        lse = torch.empty(num_splits, num_tokens, spec.num_heads, dtype=torch.float32, device=q.device)
    else:
        partial = lse = out  # unused by the kernel
    kv_format = KV_FORMATS.get(kv_cache.dtype, 0)
    scales = _scales(kv_cache, spec.head_dim) if kv_format else kv_cache  # unused by the kernel when float
    # fp8 is read as its bits: the kernel decodes them, so neither the GPU nor the interpreter needs fp8 loads.
    cache = kv_cache.view(torch.uint8) if kv_format > 1 else kv_cache
    unified_attention_kernel[(tile_req.shape[0], spec.num_kv_heads, num_splits)](
        out, q, cache, scales, partial, lse, tile_req, tile_q_start, common.query_start_loc, common.seq_lens,
        common.block_tables, spec.scale, spec.logit_softcap or 1.0,
        q.stride(0), out.stride(0), common.block_tables.stride(0),
        *kv_cache.stride()[:4], *scales.stride()[:4],
        partial.stride(0), lse.stride(0), spec.num_heads,
        GROUP=group, HEAD_DIM=spec.head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_SIZE=common.block_size,
        BLOCK_M=block_m, BLOCK_Q=block_q, TILE_N=tile_n, WINDOW=spec.sliding_window or 0,
        USE_SOFTCAP=spec.logit_softcap is not None, NUM_SPLITS=num_splits, IEEE=q.dtype == torch.float32,
        KV_FORMAT=kv_format, **(PREFILL_LAUNCH if large else {}))
    if num_splits > 1:
        merge_splits_kernel[(num_tokens, spec.num_heads)](
            out, partial, lse, out.stride(0), partial.stride(0), lse.stride(0), spec.num_heads,
            NUM_SPLITS=num_splits, SPLITS_PAD=triton.next_power_of_2(num_splits), HEAD_DIM=spec.head_dim,
            HEAD_DIM_PAD=head_dim_pad)


def _scales(kv_cache: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The float32 scales of a quantized cache, in place: ``[2, num_blocks, block_size, num_kv_heads, 1]``."""
    return kv_cache.view(torch.uint8)[..., head_dim:].view(torch.float32)


def num_kv_splits(metadata: TritonAttentionMetadata, num_kv_heads: int, device: torch.device) -> int:
    """How many programs share one query tile's keys: more only for decodes too few to fill the GPU."""
    if metadata.max_query_len > 1 or device.type != "cuda":
        return 1
    programs = metadata.common.num_reqs * num_kv_heads
    wanted = -(-2 * _num_sms(device) // programs)
    return max(1, min(wanted, MAX_KV_SPLITS, metadata.max_seq_len // MIN_KEYS_PER_SPLIT))


def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _query_tiles(query_lens: list[int], block_q: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's queries cut into tiles of ``block_q``: (request index, first query) per tile."""
    num_tiles = -(-np.asarray(query_lens, dtype=np.int64) // block_q)
    tile_req = np.repeat(np.arange(len(query_lens), dtype=np.int32), num_tiles)
    first_tile = np.concatenate([[0], np.cumsum(num_tiles)[:-1]])
    tile_q_start = ((np.arange(len(tile_req)) - first_tile[tile_req]) * block_q).astype(np.int32)
    return to_device(tile_req, device), to_device(tile_q_start, device)


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    """The kernels index rows by stride and expect each row's elements side by side."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _check_device(kv_cache: torch.Tensor) -> None:
    # Triton decides at import whether its kernels are compiled (JITFunction) or interpreted.
    if kv_cache.device.type == "cpu" and isinstance(unified_attention_kernel, JITFunction):
        raise RuntimeError("the triton attention backend needs CUDA tensors; on CPU it runs only under Triton's "
                           "interpreter (TRITON_INTERPRET=1 set before triton is imported), for tests")
