"""The reference attention backend: gathers each request's KV blocks and runs PyTorch SDPA over them."""
from __future__ import annotations

import functools

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from jido.attention.backend import AttentionBackend, AttentionLayerSpec, AttentionMetadata
from jido.attention.kv_quant import cache_rows, read_rows, row_width
from jido.utils.cpu import cpu_info


# Queries of up to this many tokens attend as decode rows (see build_plan): speculative verification's K + 1
# fits, as do short prompts; longer ones are prefills.
MAX_DECODE_ROWS = 16


@dataclass(frozen=True)
class _DecodeBatch:
    """Query rows that each attend on their own (a decode, or one token of a short query), in one call."""

    rows: torch.Tensor | None  # [num_decodes] query rows in the flat batch; None: every row, in order
    seq_lens: torch.Tensor  # [num_decodes] the keys each row sees: the context up to and including it
    block_tables: torch.Tensor  # [num_decodes, max_num_blocks] its request's
    max_seq_len: int


@dataclass(frozen=True)
class _Prefill:
    """One request with several query tokens (a prompt, or a chunk of one on top of a cached prefix)."""

    req_idx: int
    query_start: int
    query_len: int
    seq_len: int


@dataclass(frozen=True)
class TorchAttentionMetadata:
    """One step of one KV cache group: the common metadata and how its requests split into calls."""

    common: AttentionMetadata
    decodes: _DecodeBatch | None
    prefills: list[_Prefill]


class TorchAttentionBackend(AttentionBackend):
    """Readable, correct attention on any device: SDPA with explicit causal/window masks.

    Decodes and the tokens of short queries (see ``build_plan``) run as one batch padded to the longest
    context; longer queries run one by one over exactly their visible keys. Sliding-window layers gather
    only the blocks that the window reaches. Soft-capped layers use float32 math instead of SDPA, which has no soft-cap.

    Layout: one tensor per layer, ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (0 keys, 1 values);
    a quantized cache's rows are ``head_dim + 4`` wide (values, then their float32 scale's bytes), and the
    gathered blocks are dequantized to float32 before SDPA.
    NOTE: padded decode rows read cache slots beyond a request's context (masked out). The cache must hold
    finite values there, so allocate it with ``torch.zeros``, not ``torch.empty``: ``0 * NaN`` is NaN.
    """

    name = "torch"

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                           dtype: torch.dtype | None = None) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, row_width(head_dim, dtype))

    def build_metadata(self, common: AttentionMetadata) -> TorchAttentionMetadata:
        return build_plan(common)

    def forward(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: TorchAttentionMetadata,
    ) -> torch.Tensor:
        write_kv(kv_cache, k, v, metadata.common.slot_mapping)
        plan = metadata
        num_tokens = q.shape[0]
        q = q.view(num_tokens, spec.num_heads, spec.head_dim)
        out = torch.empty_like(q)
        if plan.decodes is not None:
            decode_q = q if plan.decodes.rows is None else q[plan.decodes.rows]
            decode_out = _decode_attention(spec, decode_q, kv_cache, plan.decodes)
            if plan.decodes.rows is None:
                return decode_out.view(num_tokens, -1)
            out[plan.decodes.rows] = decode_out
        for p in plan.prefills:
            rows = slice(p.query_start, p.query_start + p.query_len)
            out[rows] = _prefill_attention(spec, q[rows], kv_cache, plan.common.block_tables[p.req_idx], p.seq_len)
        return out.view(num_tokens, -1)


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter this step's keys and values into their cache slots (quantized if the cache is)."""
    _, _, _, num_kv_heads, width = kv_cache.shape
    head_dim = k.shape[1] // num_kv_heads
    # [num_blocks * block_size, num_kv_heads, width] views share the cache's storage.
    kv_cache[0].view(-1, num_kv_heads, width)[slot_mapping] = cache_rows(k.view(-1, num_kv_heads, head_dim),
                                                                        kv_cache.dtype)
    kv_cache[1].view(-1, num_kv_heads, width)[slot_mapping] = cache_rows(v.view(-1, num_kv_heads, head_dim),
                                                                        kv_cache.dtype)


def build_plan(m: AttentionMetadata, max_decode_rows: int = MAX_DECODE_ROWS) -> TorchAttentionMetadata:
    """Split a step into one batch of decode rows and the longer prefills, one by one.

    A request with up to ``max_decode_rows`` query tokens (a decode, a speculative step's K + 1, a short
    prompt) becomes that many decode rows, row ``j`` seeing the keys up to its own position: one batched
    call covers them all, where a call per request would cost more than the attention itself.
    """
    if m.is_decode_only:
        return TorchAttentionMetadata(m, _DecodeBatch(None, m.seq_lens, m.block_tables, max(m.seq_lens_list)), [])
    rows, seq_lens, reqs, prefills, start = [], [], [], [], 0
    for i, (query_len, seq_len) in enumerate(zip(m.query_lens_list, m.seq_lens_list)):
        if query_len <= max_decode_rows:
            rows.extend(range(start, start + query_len))
            seq_lens.extend(range(seq_len - query_len + 1, seq_len + 1))
            reqs.extend([i] * query_len)
        else:
            prefills.append(_Prefill(i, start, query_len, seq_len))
        start += query_len
    if not rows:
        return TorchAttentionMetadata(m, None, prefills)
    device = m.seq_lens.device
    row_index = None if len(rows) == start else torch.tensor(rows, device=device)
    batch = _DecodeBatch(row_index, torch.tensor(seq_lens, dtype=torch.int32, device=device),
                         m.block_tables[torch.tensor(reqs, device=device)], max(seq_lens))
    return TorchAttentionMetadata(m, batch, prefills)


def _decode_attention(
    spec: AttentionLayerSpec, q: torch.Tensor, kv_cache: torch.Tensor, batch: _DecodeBatch
) -> torch.Tensor:
    """Attention for ``q`` ``[num_decodes, num_heads, head_dim]``, one token per request, in one call."""
    block_size = kv_cache.shape[2]
    num_blocks = -(-batch.max_seq_len // block_size)
    seq_lens = batch.seq_lens.long()[:, None]  # [B, 1]
    first_block = torch.zeros_like(seq_lens)
    if spec.sliding_window is not None:
        # The query at seq_len - 1 sees keys >= seq_len - window: at most this many blocks.
        num_blocks = min(num_blocks, (spec.sliding_window - 1) // block_size + 2)
        first_block = (seq_lens - spec.sliding_window).clamp(min=0) // block_size
    block_idx = first_block + torch.arange(num_blocks, device=q.device)  # [B, n]
    max_idx = batch.block_tables.shape[1] - 1
    block_ids = batch.block_tables.gather(1, block_idx.clamp(max=max_idx)).long()
    # [B, n * block_size]: the position of every gathered key; slots past the context are masked.
    key_pos = (block_idx[:, :, None] * block_size + torch.arange(block_size, device=q.device)).flatten(1)
    visible = key_pos < seq_lens
    if spec.sliding_window is not None:
        visible &= key_pos >= seq_lens - spec.sliding_window
    num_reqs, num_kv_heads, head_dim = q.shape[0], spec.num_kv_heads, spec.head_dim
    # [B, n, block_size, kv_heads, width] -> [B, kv_heads, n * block_size, head_dim]
    keys = read_rows(kv_cache[0][block_ids], head_dim).view(num_reqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    values = read_rows(kv_cache[1][block_ids], head_dim).view(num_reqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    grouped_q = q.view(num_reqs, num_kv_heads, -1, head_dim)  # [B, kv_heads, group, head_dim]
    out = _attend(spec, grouped_q, keys, values, visible[:, None, None, :])
    return out.reshape(num_reqs, spec.num_heads, head_dim)


def _prefill_attention(
    spec: AttentionLayerSpec, q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """Causal attention for one request's ``q`` ``[query_len, num_heads, head_dim]``, the last tokens of its context."""
    block_size = kv_cache.shape[2]
    first_query = seq_len - q.shape[0]
    first_key = first_visible_key(spec, first_query)
    first_block = first_key // block_size
    block_ids = block_table[first_block : -(-seq_len // block_size)].long()
    keep = slice(first_key - first_block * block_size, seq_len - first_block * block_size)
    # [n, block_size, kv_heads, width] -> [kv_heads, num_keys, head_dim]
    keys = read_rows(kv_cache[0][block_ids].flatten(0, 1)[keep], spec.head_dim).transpose(0, 1)
    values = read_rows(kv_cache[1][block_ids].flatten(0, 1)[keep], spec.head_dim).transpose(0, 1)
    return causal_attention(spec, q, keys, values, first_query, first_key)


def first_visible_key(spec: AttentionLayerSpec, first_query: int) -> int:
    """The first key position any query at ``first_query`` or later can see (its sliding window's start)."""
    return 0 if spec.sliding_window is None else max(0, first_query - spec.sliding_window + 1)


# Query tiles of causal prefill (see causal_attention), one fused SDPA call per tile. On the AVX2 EPYC (Gemma 3
# 270M's shapes, float32) a sliding layer ran best in tiles well under its window, where fewer masked keys are
# computed and thrown away; a global layer in tiles of 256 ran far faster than one masked call and about as fast
# as one unmasked is_causal call.
SLIDING_QUERY_TILE = 64
GLOBAL_QUERY_TILE = 256
# Where SDPA runs bf16 on AMX, larger sliding tiles paid (the tiles multiply the masked keys cheaply, and fewer
# calls cost less); 256 did best of 64 to 512.
SLIDING_QUERY_TILE_AMX = 256


def _sliding_query_tile(q: torch.Tensor) -> int:
    return SLIDING_QUERY_TILE_AMX if q.is_cpu and cpu_info().isa == "amx" else SLIDING_QUERY_TILE


def causal_attention(spec: AttentionLayerSpec, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     first_query: int, first_key: int) -> torch.Tensor:
    """One request's ``q`` ``[query_len, num_heads, head_dim]`` at positions ``first_query...`` against gathered
    ``keys``/``values`` ``[kv_heads, num_keys, head_dim]`` at ``first_key...``, causal and windowed.

    A masked SDPA call computes every score of its mask, hidden or not, so long prompts go in query tiles, each
    against only the keys it can see: under a sliding window tiles of :data:`SLIDING_QUERY_TILE` queries
    (:data:`SLIDING_QUERY_TILE_AMX` on AMX CPUs; a tile of t queries computes t * (window + t) scores for its
    t * window visible ones), else of
    :data:`GLOBAL_QUERY_TILE` against the keys up to their last. A prompt with no cached prefix and no window is one
    call with ``is_causal``, whose fused kernel skips the blocks above the diagonal itself.
    """
    window, query_len = spec.sliding_window, q.shape[0]
    if window is None and first_query == first_key and _fused(spec, q, keys):
        return _sdpa(spec, q, keys, values, None)
    tile = _sliding_query_tile(q) if window is not None else GLOBAL_QUERY_TILE
    if query_len <= tile:
        return _causal_attention(spec, q, keys, values, first_query, first_key)
    out = []
    for start in range(0, query_len, tile):
        tile_first = first_query + start
        tile_key = max(first_key, first_visible_key(spec, tile_first))
        end = min(start + tile, query_len)
        keep = slice(tile_key - first_key, first_query + end - first_key)
        out.append(_causal_attention(spec, q[start:end], keys[:, keep], values[:, keep], tile_first, tile_key))
    return torch.cat(out)


@functools.lru_cache(maxsize=64)
def _visible(lag: int, query_len: int, num_keys: int, window: int | None, device: torch.device) -> torch.Tensor:
    """``[query_len, num_keys]`` bool: query i (at position lag + i past the first key) sees key j; kept for the
    other layers of a step (Gemma 3: its 15 sliding layers share their query tiles' masks)."""
    q_pos = torch.arange(query_len, device=device)[:, None] + lag
    k_pos = torch.arange(num_keys, device=device)[None, :]
    visible = k_pos <= q_pos
    if window is not None:
        visible &= k_pos > q_pos - window
    return visible


@functools.lru_cache(maxsize=64)
def _additive_mask(lag: int, query_len: int, num_keys: int, window: int | None, dtype: torch.dtype,
                   device: torch.device) -> torch.Tensor:
    """:func:`_visible` as SDPA's additive mask (0 or -inf in ``dtype``): SDPA turns a bool mask into this on every
    call, a large share of a small sliding tile's time, where the layers of a step share one."""
    hidden = ~_visible(lag, query_len, num_keys, window, device)
    return torch.zeros(query_len, num_keys, dtype=dtype, device=device).masked_fill_(hidden, float("-inf"))


def _causal_attention(spec: AttentionLayerSpec, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      first_query: int, first_key: int) -> torch.Tensor:
    query_len, num_kv_heads, head_dim = q.shape[0], spec.num_kv_heads, spec.head_dim
    group = spec.num_heads // num_kv_heads
    if _fused(spec, q, keys):
        mask = _additive_mask(first_query - first_key, query_len, keys.shape[1], spec.sliding_window, q.dtype,
                              q.device)
        return _sdpa(spec, q, keys, values, mask)
    visible = _visible(first_query - first_key, query_len, keys.shape[1], spec.sliding_window, q.device)
    # Fold the query heads that share a KV head into the rows: [kv_heads, group * query_len, head_dim],
    # so GQA needs no copy of K/V per query head.
    grouped_q = q.view(query_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(num_kv_heads, -1, head_dim)
    out = _attend(spec, grouped_q, keys, values, visible.repeat(group, 1))
    # [kv_heads, group * query_len, head_dim] -> [query_len, num_heads, head_dim]
    return out.view(num_kv_heads, group, query_len, head_dim).permute(2, 0, 1, 3).reshape(query_len, -1, head_dim)


def _fused(spec: AttentionLayerSpec, q: torch.Tensor, keys: torch.Tensor) -> bool:
    """Whether :func:`_sdpa` takes the layer: no soft-cap, keys in q's dtype."""
    return spec.logit_softcap is None and keys.dtype == q.dtype


def _sdpa(spec: AttentionLayerSpec, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
          mask: torch.Tensor | None) -> torch.Tensor:
    """One 4-D SDPA call, [1, heads, tokens, head_dim], whose GQA reads each KV head for its group of query heads:
    on CPU that is the fused flash kernel, where the 3-D folded call of _causal_attention falls back to the math
    path, many times slower with a [rows, keys] score matrix in memory. ``mask``
    is additive (see :func:`_additive_mask`); causal from the first key (``is_causal``) where it is None."""
    group = spec.num_heads // spec.num_kv_heads
    out = F.scaled_dot_product_attention(q.permute(1, 0, 2)[None], keys[None], values[None], attn_mask=mask,
                                         is_causal=mask is None, scale=spec.scale, enable_gqa=group > 1)
    return out[0].permute(1, 0, 2)  # [query_len, num_heads, head_dim]


def _attend(
    spec: AttentionLayerSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """``softmax(q k^T * scale [soft-capped], masked) v`` over the last two dims; ``visible`` broadcasts."""
    if k.dtype != q.dtype:  # keys dequantized to float32: attend in float32 rather than round them to q's dtype
        return _attend(spec, q.float(), k, v, visible).to(q.dtype)
    if spec.logit_softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=spec.scale)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * spec.scale
    scores = torch.tanh(scores / spec.logit_softcap) * spec.logit_softcap
    probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
    return torch.matmul(probs, v.float()).to(q.dtype)
