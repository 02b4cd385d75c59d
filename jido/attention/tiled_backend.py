"""The tiled CPU attention backend: FlashAttention-style prefill in PyTorch and paged decode read in place."""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from jido.attention.backend import AttentionBackend, AttentionLayerSpec, AttentionMetadata
from jido.attention.cpu_extension import load_flash_prefill, load_paged_decode, load_tile_prefill, load_write_kv
from jido.attention.kv_quant import cache_rows, read_rows, row_width
from jido.attention.torch_backend import (MAX_DECODE_ROWS, TorchAttentionMetadata, build_plan, causal_attention,
                                         first_visible_key)
from jido.utils.cpu import cpu_info

# A prefill whose [query, key] mask has at most this many elements runs as one fused SDPA call over its
# gathered keys: on 2k-token prompts that is faster than the tiled loop in PyTorch
# (benchmarks/results/attention_kernels-2026-12-01-zen4.md). Beyond it the tiled loop keeps memory linear in the
# context.
DENSE_PREFILL_MAX_SCORES = 1 << 23
# Queries per work item of the C++ prefill kernel (csrc/flash_prefill.cpp); for 4:1 GQA, GEMMs of 256 rows.
CPP_PREFILL_QUERY_TILE = 64
# Query x head rows per work item of the AMX tile kernel: 16 queries of 4:1 GQA, the best of 32, 64 and 128 on
# both sliding and global layers (benchmarks/results/prefill_attention-2026-12-05-amx-xeon.md).
TILE_PREFILL_ROWS = 64


@dataclass
class _Softmax:
    """Running state of the online softmax over key tiles, per query row: max, sum and unnormalized output."""

    m: torch.Tensor  # [..., rows, 1] float32, -inf until a row sees a key
    l: torch.Tensor  # [..., rows, 1]
    acc: torch.Tensor  # [..., rows, head_dim]

    @classmethod
    def empty(cls, rows_shape: tuple[int, ...], head_dim: int, device: torch.device) -> _Softmax:
        return cls(torch.full((*rows_shape, 1), float("-inf"), device=device),
                   torch.zeros((*rows_shape, 1), device=device), torch.zeros((*rows_shape, head_dim), device=device))

    def update(self, scores: torch.Tensor, values: torch.Tensor) -> None:
        """Fold in one key tile: ``scores`` ``[..., rows, keys]`` (masked keys -inf; overwritten), ``values``
        ``[..., keys, head_dim]``."""
        m_new = torch.maximum(self.m, scores.amax(dim=-1, keepdim=True))
        # A row that has seen no visible key yet keeps m = -inf; subtract 0 there so exp gives 0, not NaN.
        m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)
        probs = scores.sub_(m_safe).exp_()
        alpha = torch.exp(self.m - m_safe)  # rescale what was summed under the old max
        self.l.mul_(alpha).add_(probs.sum(dim=-1, keepdim=True))
        self.acc.mul_(alpha)
        if probs.dim() == 3:
            self.acc.baddbmm_(probs, values)
        else:
            self.acc.add_(probs @ values)
        self.m = m_new

    def result(self) -> torch.Tensor:
        return self.acc / self.l


class TiledAttentionBackend(AttentionBackend):
    """Attention whose memory grows linearly with the context, for CPUs (and correct on any device).

    Prefill runs the FlashAttention algorithm in PyTorch: query tiles of ``query_tile`` tokens against key
    tiles of ``key_tile_blocks`` cache blocks, with a running max and sum and one normalization at the end,
    so no ``[query_len, seq_len]`` score matrix exists; tiles before a sliding window or after the causal
    diagonal are skipped. Query heads that share a KV head are folded into the rows of one matmul, so K/V
    are never repeated per head.

    Decode rows (decodes, and each token of a short query: see ``build_plan``) run the C++ kernel of
    ``csrc/paged_decode.cpp`` on CPU: it reads each request's blocks in place and splits long contexts into
    equal pieces of at most ``decode_split_blocks`` blocks (at least one per core while the batch has fewer
    (request, KV head) pairs than cores) merged by log-sum-exp, so one long request uses every core. The rows of
    one request at consecutive positions (a speculative step's K + 1, a short prompt) attend as one run: each
    block is read once for all of them, and the run's splits share the cores. Where the kernel cannot be built (or on
    other devices) decodes run the same online softmax in PyTorch over key tiles gathered for the batch.

    ``batch_invariant``: every query row, a prompt's too, runs the C++ decode kernel with splits at fixed multiples of
    ``decode_split_blocks`` blocks (``fixed_splits``), so a row's keys are summed in an order set by its own position
    alone: the same bits alone or batched, in a whole prompt, a chunk, or after a cached prefix. It needs the kernel
    (a ``RuntimeError`` at construction where it cannot be built).

    Layout: one tensor per layer, ``[2, num_blocks, num_kv_heads, block_size, head_dim]`` (0 keys, 1 values):
    one (block, KV head) pair is a contiguous ``[block_size, head_dim]`` tile, read with unit stride. A
    quantized cache's rows are ``head_dim + 4`` wide (values, then their float32 scale's bytes): the C++
    decode reads them in place and folds each row's scale into its score and its softmax weight; the
    PyTorch paths dequantize the key tiles they gather.
    NOTE: the PyTorch decode path reads slots past a request's context in its last tile (masked); as for
    the reference backend, allocate the cache with ``torch.zeros`` so those slots hold finite values.
    """

    name = "tiled"
    block_token_dim = 2  # a block is [2, kv_heads, block_size, width]
    supports_batch_invariance = True

    def __init__(self, query_tile: int = 256, key_tile_blocks: int = 32, decode_split_blocks: int = 32,
                 use_cpp_decode: bool = True, dense_prefill_max_scores: int = DENSE_PREFILL_MAX_SCORES,
                 use_cpp_prefill: bool = True, prefill_query_tile: int = CPP_PREFILL_QUERY_TILE,
                 batch_invariant: bool = False) -> None:
        self.use_cpp_prefill = use_cpp_prefill
        self.prefill_query_tile = prefill_query_tile
        self.dense_prefill_max_scores = dense_prefill_max_scores
        self.query_tile = query_tile
        self.key_tile_blocks = key_tile_blocks
        self.decode_split_blocks = decode_split_blocks
        self.use_cpp_decode = use_cpp_decode
        self.batch_invariant = batch_invariant
        # Under batch_invariant every row is a decode row, whatever its request's query length.
        self.max_decode_rows = sys.maxsize if batch_invariant else MAX_DECODE_ROWS
        if batch_invariant and (not use_cpp_decode or load_paged_decode() is None):
            raise RuntimeError("batch_invariant attends every row with the C++ paged decode kernel, which did not "
                               "build here (its compiler output is logged above); run without batch_invariant")

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                           dtype: torch.dtype | None = None) -> tuple[int, ...]:
        return (2, num_blocks, num_kv_heads, block_size, row_width(head_dim, dtype))

    def build_metadata(self, common: AttentionMetadata) -> TorchAttentionMetadata:
        return build_plan(common, self.max_decode_rows)

    def forward(self, spec: AttentionLayerSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, metadata: TorchAttentionMetadata) -> torch.Tensor:
        write_kv(kv_cache, k, v, metadata.common.slot_mapping)
        num_tokens = q.shape[0]
        q = q.view(num_tokens, spec.num_heads, spec.head_dim)
        batch = metadata.decodes
        if batch is not None and batch.rows is None:  # decode rows only: the common step, in fewest calls
            return self._decode(spec, q, kv_cache, batch.block_tables, batch.seq_lens).view(num_tokens, -1)
        out = torch.empty_like(q)
        if batch is not None:
            out[batch.rows] = self._decode(spec, q[batch.rows], kv_cache, batch.block_tables, batch.seq_lens)
        for p in metadata.prefills:
            rows = slice(p.query_start, p.query_start + p.query_len)
            result = self._prefill(spec, q[rows], k[rows], v[rows], kv_cache,
                                   metadata.common.block_tables[p.req_idx], p.seq_len)
            if p.query_len == num_tokens:  # the step's only request: no copy into out
                return result.reshape(num_tokens, -1)
            out[rows] = result
        return out.view(num_tokens, -1)

    def _prefill(self, spec: AttentionLayerSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
        """One request's prefill attention; ``k``/``v`` are its keys and values of this step."""
        query_len = q.shape[0]
        # A prompt with nothing cached sees only this step's keys: take them as they came, not gathered back out
        # of the cache they were just written to (where the cache holds their dtype, so the values are the same).
        context = None
        if query_len == seq_len and kv_cache.dtype == k.dtype:
            context = (k.view(query_len, spec.num_kv_heads, spec.head_dim).transpose(0, 1),
                       v.view(query_len, spec.num_kv_heads, spec.head_dim).transpose(0, 1))
        chosen = self._cpp_prefill_kernel(spec, q, kv_cache)
        if chosen is not None:
            kernel, query_tile = chosen
            return cpp_prefill_attention(spec, q, kv_cache, block_table, seq_len, kernel, query_tile, context)
        if query_len * _num_visible_keys(spec, seq_len, query_len) <= self.dense_prefill_max_scores:
            return dense_prefill_attention(spec, q, kv_cache, block_table, seq_len, context)
        return prefill_attention(spec, q, kv_cache, block_table, seq_len, self.query_tile, self.key_tile_blocks)

    def _decode(self, spec: AttentionLayerSpec, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                seq_lens: torch.Tensor) -> torch.Tensor:
        kernel = self._cpp_kernel(q)
        if kernel is None:
            return decode_attention(spec, q, kv_cache, block_tables, seq_lens, self.key_tile_blocks)
        out = torch.empty_like(q)
        kernel(out, q.contiguous(), kv_cache, block_tables, seq_lens, spec.scale, spec.sliding_window or 0,
               spec.logit_softcap or 0.0, self.decode_split_blocks, self.batch_invariant)
        return out

    def _cpp_prefill_kernel(self, spec: AttentionLayerSpec, q: torch.Tensor,
                            kv_cache: torch.Tensor) -> tuple[Callable, int] | None:
        """The C++ prefill kernel for this layer and its queries per work item: on AMX tiles where this process has
        them, else on oneDNN's AVX-512 BF16 micro-kernels (None on AMX CPUs: SDPA measured faster there)."""
        if not (self.use_cpp_prefill and q.is_cpu and q.dtype == kv_cache.dtype == torch.bfloat16
                and spec.head_dim % 64 == 0 and cpu_info().has_native_bf16):
            return None
        tiles = load_tile_prefill()
        if tiles is not None:
            return tiles, max(1, TILE_PREFILL_ROWS // (spec.num_heads // spec.num_kv_heads))
        kernel = load_flash_prefill()
        return None if kernel is None else (kernel, self.prefill_query_tile)

    def _cpp_kernel(self, q: torch.Tensor) -> Callable | None:
        if not self.use_cpp_decode or not q.is_cpu or q.dtype not in (torch.float32, torch.bfloat16):
            return None
        return load_paged_decode()


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter this step's keys and values into their slots of the ``[2, blocks, kv_heads, block_size, width]``
    cache (quantized if the cache is): on CPU by one C++ call where the cache holds k's dtype."""
    if kv_cache.is_cpu and k.dtype == kv_cache.dtype and k.dim() == 2 and k.stride(1) == v.stride(1) == 1:
        kernel = load_write_kv()
        if kernel is not None:
            return kernel(kv_cache, k, v, slot_mapping)
    _, _, num_kv_heads, block_size, _ = kv_cache.shape
    head_dim = k.shape[1] // num_kv_heads
    block_ids, offsets = slot_mapping // block_size, slot_mapping % block_size
    # Indexing dims 0 and 2 around the kv-head slice gives [num_tokens, num_kv_heads, width].
    kv_cache[0][block_ids, :, offsets] = cache_rows(k.view(-1, num_kv_heads, head_dim), kv_cache.dtype)
    kv_cache[1][block_ids, :, offsets] = cache_rows(v.view(-1, num_kv_heads, head_dim), kv_cache.dtype)


def _num_visible_keys(spec: AttentionLayerSpec, seq_len: int, query_len: int) -> int:
    return seq_len - first_visible_key(spec, seq_len - query_len)


Context = tuple[torch.Tensor, torch.Tensor]  # a prompt's keys and values [kv_heads, seq_len, head_dim], from position 0


def dense_prefill_attention(spec: AttentionLayerSpec, q: torch.Tensor, kv_cache: torch.Tensor,
                            block_table: torch.Tensor, seq_len: int, context: Context | None = None) -> torch.Tensor:
    """The same as :func:`prefill_attention` in one masked SDPA call over the gathered keys (short prompts), or over
    ``context``, the whole context's keys and values where the caller has them."""
    first_query = seq_len - q.shape[0]
    keys, values, first_key = _visible_context(spec, kv_cache, block_table, first_query, seq_len, context)
    return causal_attention(spec, q, keys, values, first_query, first_key)


def cpp_prefill_attention(spec: AttentionLayerSpec, q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                          seq_len: int, kernel: Callable, query_tile: int, context: Context | None = None) -> torch.Tensor:
    """The same as :func:`prefill_attention` by the C++ kernel of ``csrc/flash_prefill.cpp`` over the gathered keys
    (or ``context``, as for :func:`dense_prefill_attention`)."""
    first_query = seq_len - q.shape[0]
    keys, values, first_key = _visible_context(spec, kv_cache, block_table, first_query, seq_len, context)
    out = torch.empty(q.shape, dtype=q.dtype)  # q and the keys go in as the views they are: the kernel copies rows
    kernel(out, q, keys, values, spec.scale, first_query, first_key,
           spec.sliding_window or 0, spec.logit_softcap or 0.0, query_tile)
    return out


def _visible_context(spec: AttentionLayerSpec, kv_cache: torch.Tensor, block_table: torch.Tensor, first_query: int,
                     seq_len: int, context: Context | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The keys and values ``[kv_heads, num_keys, head_dim]`` that queries from ``first_query`` on can see, and the
    position of the first: cut from ``context`` where given, else gathered from the cache."""
    num_kv_heads, head_dim, block_size, width = spec.num_kv_heads, spec.head_dim, kv_cache.shape[3], kv_cache.shape[4]
    first_key = first_visible_key(spec, first_query)
    if context is not None:
        return context[0][:, first_key:seq_len], context[1][:, first_key:seq_len], first_key
    first_block = first_key // block_size
    block_ids = block_table[first_block : -(-seq_len // block_size)].long()
    keep = slice(first_key - first_block * block_size, seq_len - first_block * block_size)
    # [n, kv_heads, block_size, width] -> [kv_heads, num_keys, head_dim]
    keys = read_rows(kv_cache[0][block_ids].transpose(0, 1).reshape(num_kv_heads, -1, width)[:, keep], head_dim)
    values = read_rows(kv_cache[1][block_ids].transpose(0, 1).reshape(num_kv_heads, -1, width)[:, keep], head_dim)
    return keys, values, first_key


def prefill_attention(spec: AttentionLayerSpec, q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                      seq_len: int, query_tile: int, key_tile_blocks: int) -> torch.Tensor:
    """Causal attention for one request's ``q`` ``[query_len, num_heads, head_dim]``, the last tokens of its context."""
    query_len, num_kv_heads, head_dim = q.shape[0], spec.num_kv_heads, spec.head_dim
    group, first_query = spec.num_heads // num_kv_heads, seq_len - query_len
    # [kv_heads, group, query_len, head_dim], scaled once, in float32 whatever the cache holds.
    grouped_q = (q.float() * spec.scale).view(query_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    out = torch.empty(num_kv_heads, group, query_len, head_dim, device=q.device)
    block_size = kv_cache.shape[3]
    for start in range(0, query_len, query_tile):
        end = min(start + query_tile, query_len)
        tile = grouped_q[:, :, start:end].reshape(num_kv_heads, group * (end - start), head_dim)
        q_pos = torch.arange(first_query + start, first_query + end, device=q.device).repeat(group)[:, None]
        state = _Softmax.empty((num_kv_heads, group * (end - start)), head_dim, q.device)
        key_tiles = _key_tiles(spec, first_query + start, first_query + end, block_size, key_tile_blocks)
        for block_lo, block_hi in key_tiles:
            keys, values, k_pos = _gather_tile(kv_cache, block_table[block_lo:block_hi].long(), block_lo, head_dim)
            scores = _softcap(spec, torch.bmm(tile, keys.transpose(1, 2)))  # [kv_heads, group * tile_len, tile_keys]
            if not _all_visible(spec, first_query + start, first_query + end - 1, block_lo * block_size,
                                block_hi * block_size - 1):
                scores = _mask(spec, scores, q_pos, k_pos[None, :])
            state.update(scores, values)
        out[:, :, start:end] = state.result().view(num_kv_heads, group, end - start, head_dim)
    # [kv_heads, group, query_len, head_dim] -> [query_len, num_heads, head_dim]
    return out.permute(2, 0, 1, 3).reshape(query_len, spec.num_heads, head_dim).to(q.dtype)


def _key_tiles(spec: AttentionLayerSpec, first_pos: int, end_pos: int, block_size: int,
               key_tile_blocks: int) -> list[tuple[int, int]]:
    """Block ranges of the key tiles that queries at ``first_pos .. end_pos - 1`` can see."""
    first_key = first_visible_key(spec, first_pos)
    first_block, end_block = first_key // block_size, -(-end_pos // block_size)
    return [(b, min(b + key_tile_blocks, end_block)) for b in range(first_block, end_block, key_tile_blocks)]


def _gather_tile(kv_cache: torch.Tensor, block_ids: torch.Tensor, first_block: int,
                 head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys and values of consecutive blocks ``[kv_heads, n * block_size, head_dim]`` in float32, and their positions."""
    _, _, num_kv_heads, block_size, width = kv_cache.shape
    # [n, kv_heads, block_size, width] -> [kv_heads, n * block_size, head_dim]
    keys = read_rows(kv_cache[0][block_ids].transpose(0, 1).reshape(num_kv_heads, -1, width), head_dim).float()
    values = read_rows(kv_cache[1][block_ids].transpose(0, 1).reshape(num_kv_heads, -1, width), head_dim).float()
    k_pos = torch.arange(first_block * block_size, first_block * block_size + keys.shape[1], device=keys.device)
    return keys, values, k_pos


def _all_visible(spec: AttentionLayerSpec, first_q: int, last_q: int, first_k: int, last_k: int) -> bool:
    """Every query in ``first_q..last_q`` sees every key in ``first_k..last_k``: the tile needs no mask."""
    return last_k <= first_q and (spec.sliding_window is None or first_k > last_q - spec.sliding_window)


def _softcap(spec: AttentionLayerSpec, scores: torch.Tensor) -> torch.Tensor:
    if spec.logit_softcap is None:
        return scores
    return scores.div_(spec.logit_softcap).tanh_().mul_(spec.logit_softcap)


def _mask(spec: AttentionLayerSpec, scores: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``scores`` with keys a query cannot see (after it, or before its window) set to -inf; positions broadcast."""
    hidden = k_pos > q_pos
    if spec.sliding_window is not None:
        hidden |= k_pos <= q_pos - spec.sliding_window
    return scores.masked_fill_(hidden, float("-inf"))


def decode_attention(spec: AttentionLayerSpec, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, key_tile_blocks: int) -> torch.Tensor:
    """Attention for ``q`` ``[num_decodes, num_heads, head_dim]``, one token per request, over key tiles of the batch."""
    num_reqs, num_kv_heads, head_dim = q.shape[0], spec.num_kv_heads, spec.head_dim
    block_size = kv_cache.shape[3]
    seq_lens = seq_lens.long()[:, None]  # [B, 1]
    first_block = torch.zeros_like(seq_lens)
    if spec.sliding_window is not None:
        first_block = (seq_lens - spec.sliding_window).clamp(min=0) // block_size
    num_blocks = int((-(-seq_lens // block_size) - first_block).max())
    # [B, kv_heads, group, head_dim]
    grouped_q = (q.float() * spec.scale).view(num_reqs, num_kv_heads, -1, head_dim)
    state = _Softmax.empty(grouped_q.shape[:3], head_dim, q.device)
    offsets = torch.arange(block_size, device=q.device)
    for lo in range(0, num_blocks, key_tile_blocks):
        block_idx = first_block + torch.arange(lo, min(lo + key_tile_blocks, num_blocks), device=q.device)  # [B, n]
        block_ids = block_tables.gather(1, block_idx.clamp(max=block_tables.shape[1] - 1)).long()
        # [B, n, kv_heads, block_size, width] -> [B, kv_heads, n * block_size, head_dim]
        keys = read_rows(kv_cache[0][block_ids].transpose(1, 2).flatten(2, 3), head_dim).float()
        values = read_rows(kv_cache[1][block_ids].transpose(1, 2).flatten(2, 3), head_dim).float()
        scores = _softcap(spec, grouped_q @ keys.transpose(-1, -2))  # [B, kv_heads, group, n * block_size]
        k_pos = (block_idx[:, :, None] * block_size + offsets).flatten(1)  # [B, n * block_size]
        hidden = k_pos >= seq_lens
        if spec.sliding_window is not None:
            hidden |= k_pos < seq_lens - spec.sliding_window
        state.update(scores.masked_fill(hidden[:, None, None, :], float("-inf")), values)
    return state.result().reshape(num_reqs, spec.num_heads, head_dim).to(q.dtype)
