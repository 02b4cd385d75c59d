"""Triton kernels of the ``triton`` attention backend: the KV write, unified paged attention, the split merge."""
from __future__ import annotations

import triton
import triton.language as tl

# exp(x) == exp2(x * LOG2E): the kernels keep scores in base 2, where exp2 is the cheap instruction.
LOG2E = tl.constexpr(1.4426950408889634)  # a constexpr: compiled kernels may read no other globals


@triton.jit
def reshape_and_cache_kernel(
    k_ptr, v_ptr, cache_ptr, slot_mapping_ptr,
    k_row_stride, v_row_stride, cache_kv_stride, cache_block_stride, cache_slot_stride,
    BLOCK_SIZE: tl.constexpr, ROW_WIDTH: tl.constexpr, ROW_WIDTH_PAD: tl.constexpr,
):
    """One program per token: copy its key and value rows (``num_kv_heads * head_dim``) into its slot."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    offs = tl.arange(0, ROW_WIDTH_PAD)
    # A negative slot is a padding token (vLLM's convention): nothing of it is copied.
    in_row = offs < tl.where(slot >= 0, ROW_WIDTH, 0)
    k = tl.load(k_ptr + token * k_row_stride + offs, mask=in_row)
    v = tl.load(v_ptr + token * v_row_stride + offs, mask=in_row)
    dst = cache_ptr + (slot // BLOCK_SIZE) * cache_block_stride + (slot % BLOCK_SIZE) * cache_slot_stride + offs
    tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=in_row)
    tl.store(dst + cache_kv_stride, v.to(cache_ptr.dtype.element_ty), mask=in_row)


@triton.jit
def _tanh(x):
    # 1 - 2 / (e^2x + 1): exact at both tails (e^2x -> inf gives 1, -> 0 gives -1), no libdevice needed.
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _fp8_to_float(bits, MANT: tl.constexpr, BIAS: tl.constexpr):
    """fp8 values from their bits (uint8), by integer ops that need no fp8 support in the GPU or interpreter:
    a normal number's exponent and mantissa move into float32's places and the exponent is rebiased; a
    subnormal one (exponent 0) is its mantissa times the smallest subnormal step."""
    b = bits.to(tl.uint32)
    mag = b & 0x7F
    normal = ((mag << (23 - MANT)) + ((127 - BIAS) << 23)).to(tl.float32, bitcast=True)
    subnormal = (mag & ((1 << MANT) - 1)).to(tl.float32) * (1.0 / (1 << (BIAS + MANT - 1)))
    value = tl.where((mag >> MANT) == 0, subnormal, normal)
    return tl.where((b & 0x80) != 0, -value, value)


@triton.jit
def _kv_values(x, KV_FORMAT: tl.constexpr):
    """Cache elements as float32: a quantized format's raw values (its scale is applied by the caller)."""
    if KV_FORMAT == 1:  # int8
        out = x.to(tl.float32)
    elif KV_FORMAT == 2:  # fp8 e4m3 (float8_e4m3fn), read as uint8
        out = _fp8_to_float(x, 3, 7)
    elif KV_FORMAT == 3:  # fp8 e5m2, read as uint8
        out = _fp8_to_float(x, 2, 15)
    else:
        out = x
    return out


@triton.jit
def unified_attention_kernel(
    out_ptr, q_ptr, cache_ptr, scale_ptr, partial_ptr, lse_ptr,
    tile_req_ptr, tile_q_start_ptr, query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
    scale, softcap,
    q_row_stride, out_row_stride, block_table_stride,
    cache_kv_stride, cache_block_stride, cache_slot_stride, cache_head_stride,
    scale_kv_stride, scale_block_stride, scale_slot_stride, scale_head_stride,
    partial_split_stride, lse_split_stride, num_heads,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, TILE_N: tl.constexpr, WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr, NUM_SPLITS: tl.constexpr, IEEE: tl.constexpr, KV_FORMAT: tl.constexpr,
):
    """One program per (query tile of one request, KV head, KV split).

    The tile's ``BLOCK_M`` rows are ``BLOCK_Q`` consecutive queries times the ``GROUP`` query heads that
    share the KV head (row ``r``: query ``r // GROUP``, head ``r % GROUP``), so each key and value is
    loaded once for the whole group. Keys are visited ``TILE_N`` at a time through the block table with
    the online softmax. With one split the program writes the normalized output; with several, split
    ``s`` takes the ``s``-th share of the key tiles and writes its normalized partial output and its
    log2-sum-exp for :func:`merge_splits_kernel`.

    ``KV_FORMAT`` 0 reads float rows; 1, 2, 3 read quantized ones (int8, fp8 e4m3, fp8 e5m2) whose float32
    scales ``scale_ptr`` addresses per (K or V, block, slot, KV head): each key's scale multiplies its
    score, each value's its softmax weight, so tiles are dequantized only to their raw values.
    """
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    req = tl.load(tile_req_ptr + tile)
    q_start = tl.load(tile_q_start_ptr + tile)  # first query of the tile, counted within its request
    query_start = tl.load(query_start_loc_ptr + req)
    query_len = tl.load(query_start_loc_ptr + req + 1) - query_start
    context_len = tl.load(seq_lens_ptr + req) - query_len

    offs_m = tl.arange(0, BLOCK_M)
    q_idx = q_start + offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    row_ok = (offs_m < BLOCK_Q * GROUP) & (q_idx < query_len)
    q_pos = context_len + q_idx  # [BLOCK_M] position of each row's query in its request
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    token = (query_start + q_idx).to(tl.int64)
    q = tl.load(q_ptr + token[:, None] * q_row_stride + (head * HEAD_DIM)[:, None] + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, HEAD_DIM_PAD]

    # Keys any row of the tile sees: [key_start, key_end).
    key_end = context_len + tl.minimum(q_start + BLOCK_Q, query_len)
    key_start = 0
    if WINDOW > 0:
        key_start = tl.maximum(context_len + q_start - WINDOW + 1, 0)
    first_tile = key_start // TILE_N
    tiles_per_split = tl.cdiv(tl.cdiv(key_end, TILE_N) - first_tile, NUM_SPLITS)
    lo = (first_tile + split * tiles_per_split) * TILE_N
    hi = tl.minimum(lo + tiles_per_split * TILE_N, key_end)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    head_offset = kv_head * cache_head_stride
    for tile_start in range(lo, hi, TILE_N):
        k_pos = tile_start + tl.arange(0, TILE_N)
        # NOTE: keys outside [key_start, key_end) are never loaded: blocks a window has passed may hold
        # anything (freed, reused), and 0 * NaN would poison the sum.
        k_ok = (k_pos >= key_start) & (k_pos < key_end)
        block_id = tl.load(block_tables_ptr + req * block_table_stride + k_pos // BLOCK_SIZE, mask=k_ok, other=0)
        slot_offset = (block_id.to(tl.int64) * cache_block_stride + (k_pos % BLOCK_SIZE) * cache_slot_stride
                       + head_offset)  # [TILE_N]
        kv_ok = k_ok[:, None] & d_ok[None, :]
        k = tl.load(cache_ptr + slot_offset[:, None] + offs_d[None, :], mask=kv_ok, other=0)
        v = tl.load(cache_ptr + cache_kv_stride + slot_offset[:, None] + offs_d[None, :], mask=kv_ok, other=0)
        if KV_FORMAT != 0:
            # Raw int8 / fp8 values are exact in q's dtype (bf16, fp16 or float32), so the dots lose nothing.
            k = _kv_values(k, KV_FORMAT).to(q.dtype)
            v = _kv_values(v, KV_FORMAT).to(q.dtype)
            scale_offset = (block_id.to(tl.int64) * scale_block_stride + (k_pos % BLOCK_SIZE) * scale_slot_stride
                            + kv_head * scale_head_stride)  # [TILE_N]
            k_scale = tl.load(scale_ptr + scale_offset, mask=k_ok, other=0.0)
            v_scale = tl.load(scale_ptr + scale_kv_stride + scale_offset, mask=k_ok, other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        if KV_FORMAT != 0:
            s = s * k_scale[None, :]
        s = s * scale  # [BLOCK_M, TILE_N]
        if USE_SOFTCAP:
            s = softcap * _tanh(s / softcap)
        visible = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :]
        if WINDOW > 0:
            visible = visible & (k_pos[None, :] > q_pos[:, None] - WINDOW)
        s = tl.where(visible, s * LOG2E, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no visible key yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if KV_FORMAT != 0:
            p = p * v_scale[None, :]  # after the sum: l_i normalizes the weights, not the values
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    store_ok = row_ok[:, None] & d_ok[None, :]
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a split with no visible key writes zeros
    if NUM_SPLITS == 1:
        tl.store(out_ptr + token[:, None] * out_row_stride + (head * HEAD_DIM)[:, None] + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=store_ok)
    else:
        row = token * num_heads + head  # [BLOCK_M] (token, head) in the partial buffers
        tl.store(partial_ptr + split * partial_split_stride + row[:, None] * HEAD_DIM + offs_d[None, :], out,
                 mask=store_ok)
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + split * lse_split_stride + row, lse, mask=row_ok)


@triton.jit
def merge_splits_kernel(
    out_ptr, partial_ptr, lse_ptr, out_row_stride, partial_split_stride, lse_split_stride, num_heads,
    NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
):
    """One program per (token, head): weigh each split's output by its share of the softmax sum."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    row = token * num_heads + head
    splits = tl.arange(0, SPLITS_PAD)
    lse = tl.load(lse_ptr + splits * lse_split_stride + row, mask=splits < NUM_SPLITS, other=float("-inf"))
    # At least one split saw a key (every query sees itself), so the max is finite.
    weight = tl.exp2(lse - tl.max(lse, 0))  # [SPLITS_PAD]
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    ok = (splits[:, None] < NUM_SPLITS) & (offs_d[None, :] < HEAD_DIM)
    partial = tl.load(partial_ptr + splits[:, None] * partial_split_stride + row * HEAD_DIM + offs_d[None, :],
                      mask=ok, other=0.0)  # [SPLITS_PAD, HEAD_DIM_PAD]
    out = tl.sum(partial * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(out_ptr + token * out_row_stride + head * HEAD_DIM + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)
