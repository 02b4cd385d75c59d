"""Weight-quantized linear and embedding kernels on CPU: int8 and int4 weights with group-wise scales (and mins).

A :class:`QuantizedWeight` holds ``w[n, k] = scales[n, k // group_size] * q[n, k] (+ mins[n, k // group_size])``.
:func:`quant_linear` runs ``x w^T`` on it with the C++ kernels of ``csrc/quant_linear.cpp`` (built at first use by
:mod:`jido.utils.cpp_build`), which stream the quantized bytes once and dequantize in registers (decode is
memory-bound, so fewer bytes is faster): fp32 FMAs for a few rows, bf16 dot products (AVX512_BF16) for more rows
of bf16 x, and for many rows otherwise tiles of ``w`` dequantized and multiplied by ``F.linear``. Without a
compiler the same results come from the PyTorch reference: :func:`dequantize_reference` and ``F.linear``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from jido.utils.cpp_build import load_ops_library

SOURCE = Path(__file__).parent / "csrc" / "quant_linear.cpp"
# Crossovers measured on Gemma 3 270M's shapes (benchmarks/results/quant_kernels-2026-12-01-zen4.md): bf16 x on a
# CPU with AVX512_BF16 takes the bf16-dot kernel from this many rows (below it the fp32 kernel is as fast and
# keeps w exact) ...
BF16_DOTS_MIN_ROWS = 4
# ... and otherwise the fp32 kernel runs up to this many rows, dequantized tiles and a matmul above.
MAX_STREAMING_ROWS = 16
# Rows of w dequantized per tile on the matmul path: a few MB, so a tile is still in cache when multiplied.
TILE_ROWS = 4096


@dataclass(frozen=True)
class QuantizedWeight:
    """w[n, k] = scales[n, k // group_size] * q[n, k] + (mins[n, k // group_size] if mins is not None else 0).

    Scales and mins are float32; or float16 after :func:`compact_scales`; or, with ``scale_supers`` (a K-quant's, see
    :func:`pack`), int8 integers times a float32 factor per super-block of :data:`SUPER_BLOCK` columns:
    ``scales[n, g] = scale_supers[n, g // (SUPER_BLOCK / group_size)] * scales[n, g]``, and ``mins`` likewise with
    ``min_supers``. The int8 dot kernels read each form; the float kernels here take them widened (:attr:`float_scales`,
    :attr:`float_mins`), the same float32 values in every form."""

    data: torch.Tensor  # bits=8: int8 [N, K]; bits=4: uint8 [N, ceil(K/2)], q[n, 2j] in the low nibble, q[n, 2j+1] in the high nibble, values 0..15
    scales: torch.Tensor  # float32, float16 or (with scale_supers) int8 [N, ceil(K / group_size)]
    mins: torch.Tensor | None  # the dtype and shape of scales, or None
    group_size: int
    bits: int  # 8 or 4
    shape: tuple[int, int]  # (N, K)
    scale_supers: torch.Tensor | None = None  # float32 [N, K / SUPER_BLOCK]
    min_supers: torch.Tensor | None = None  # as scale_supers, where mins are set

    @property
    def float_scales(self) -> torch.Tensor:
        return _widened(self.scales, self.scale_supers)

    @property
    def float_mins(self) -> torch.Tensor | None:
        return None if self.mins is None else _widened(self.mins, self.min_supers)


# Columns per K-quant super-block (GGML's QK_K), over which one factor scales a row's group scales.
SUPER_BLOCK = 256


def _widened(values: torch.Tensor, supers: torch.Tensor | None) -> torch.Tensor:
    """Scales or mins as float32: each integer times its super-block's factor (one float32 product, exact), or the
    stored floats."""
    if supers is None:
        return values.float()
    rows, groups = values.shape
    return (supers.unsqueeze(-1) * values.float().view(rows, supers.shape[1], -1)).view(rows, groups)


def _factored(values: torch.Tensor, supers: torch.Tensor | None, group_size: int) -> torch.Tensor | None:
    """int8 ``c`` with ``supers[n, s] * c[n, g] == values[n, g]`` bit for bit for every group g of super-block s, or
    None where some value is no such product (or the groups do not tile the super-blocks)."""
    rows, groups = values.shape
    if supers is None or SUPER_BLOCK % group_size or supers.shape != (rows, groups * group_size // SUPER_BLOCK):
        return None
    grouped = values.view(rows, supers.shape[1], -1)
    factor = supers.unsqueeze(-1)
    codes = torch.where(factor == 0, torch.zeros_like(grouped), grouped / factor).round()
    if not bool(((codes >= -128) & (codes <= 127)).all()) or not torch.equal(factor * codes, grouped):
        return None
    return codes.to(torch.int8).view(rows, groups).contiguous()


def compact_scales(w: QuantizedWeight) -> QuantizedWeight:
    """``w`` with its scales and mins in float16 where every one of them is a float16 value, else ``w`` as it is: half
    the bytes beside the codes, which one-row decode reads with them, and the same numbers.

    A GGUF file's Q8_0, Q4_0, Q5_0, Q4_1 and Q5_1 groups are scaled by the file's float16 ``d`` (and ``m``), so their
    codes compact. A K-quant's group scale is ``d * sc`` (a float16 ``d`` times a 6- or 8-bit integer), which float16
    does not hold (rounded to float16, half an ulp, Gemma 3 270M's float32 perplexity moved by up to 1% on a 256-token
    chunk of one held-out domain): :func:`pack` holds those as the integers under their factors instead, exactly."""
    if w.scales.dtype == torch.float16 or w.scale_supers is not None:  # compact already
        return w
    scales = w.scales.half()
    if not torch.equal(scales.float(), w.scales):
        return w
    mins = None if w.mins is None else w.mins.half()
    if mins is not None and not torch.equal(mins.float(), w.mins):
        return w
    return QuantizedWeight(w.data, scales, mins, w.group_size, w.bits, w.shape)


def with_float_scales(w: QuantizedWeight) -> QuantizedWeight:
    """``w`` with float32 scales and mins, for kernels that read them so on every call (the float kernels here)."""
    if w.scales.dtype == torch.float32:
        return w
    return QuantizedWeight(w.data, w.float_scales, w.float_mins, w.group_size, w.bits, w.shape)


@functools.cache
def load_quant_ops(source: Path = SOURCE) -> object | None:
    """``torch.ops.jido_quant`` (``linear``, ``dequantize``) built from ``source``, or None (with a warning)."""
    if not load_ops_library("jido_quant", source, "C++ quantized linear kernels", "dequantize + F.linear"):
        return None
    return torch.ops.jido_quant


@functools.cache
def has_bf16_dots() -> bool:
    """The C++ kernels are built and this CPU runs their bf16-dot kernel (AVX512_BF16)."""
    ops = load_quant_ops()
    return ops is not None and ops.bf16_dots_supported()


def pack(q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None, group_size: int,
         bits: int, scale_supers: torch.Tensor | None = None, min_supers: torch.Tensor | None = None) -> QuantizedWeight:
    """A :class:`QuantizedWeight` from integer values ``q`` ``[N, K]`` (bits 8: -128..127, bits 4: 0..15), their
    ``scales`` and optional ``mins`` ``[N, ceil(K / group_size)]``; int4 values are packed two to a byte.

    ``scale_supers`` (and ``min_supers``, with mins): a factor per super-block of :data:`SUPER_BLOCK` columns (a
    K-quant's ``d`` and ``-dmin``, float32 ``[N, K / 256]``). Where every scale (and min) is that factor times an
    int8 integer, bit for bit, they are held so: a byte a group plus 4 bytes a super-block, against 4 bytes a group.
    Else they stay float32.

    Raises ValueError naming the argument whose shape, dtype or range is wrong.
    """
    if bits not in (8, 4):
        raise ValueError(f"bits must be 8 or 4, got {bits}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if q.dim() != 2 or q.dtype.is_floating_point or q.dtype.is_complex or q.dtype == torch.bool:
        raise ValueError(f"q must be a 2-D integer tensor [N, K], got {q.dtype} of shape {tuple(q.shape)}")
    low, high = (-128, 127) if bits == 8 else (0, 15)
    if q.numel() and (int(q.min()) < low or int(q.max()) > high):
        raise ValueError(f"q values must lie in {low}..{high} for bits={bits}, got {int(q.min())}..{int(q.max())}")
    num_rows, num_cols = q.shape
    groups_shape = (num_rows, -(-num_cols // group_size))
    scales = _group_tensor("scales", scales, groups_shape)
    mins = None if mins is None else _group_tensor("mins", mins, groups_shape)
    data = q.to(torch.int8).contiguous() if bits == 8 else _pack_nibbles(q)
    scale_codes = _factored(scales, scale_supers, group_size)
    min_codes = None if mins is None else _factored(mins, min_supers, group_size)
    if scale_codes is not None and (mins is None or min_codes is not None):
        return QuantizedWeight(data, scale_codes, min_codes, group_size, bits, (num_rows, num_cols),
                               scale_supers.float().contiguous(),
                               None if mins is None else min_supers.float().contiguous())
    return QuantizedWeight(data, scales, mins, group_size, bits, (num_rows, num_cols))


def _group_tensor(name: str, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """``values`` as contiguous float32 after checking it is a floating tensor of the groups' ``shape``."""
    if not values.dtype.is_floating_point or tuple(values.shape) != shape:
        raise ValueError(f"{name} must be a floating tensor of shape [N, ceil(K / group_size)] = {list(shape)}, "
                         f"got {values.dtype} of shape {list(values.shape)}")
    return values.to(torch.float32).contiguous()


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` values 0..15 -> uint8 ``[N, ceil(K / 2)]``, even columns in the low nibbles (an odd K pads a 0)."""
    q = q.to(torch.uint8)
    if q.shape[1] % 2:
        q = F.pad(q, (0, 1))
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def _unpack_nibbles(data: torch.Tensor, num_cols: int) -> torch.Tensor:
    """The inverse of :func:`_pack_nibbles`: uint8 ``[N, ceil(K / 2)]`` -> uint8 ``[N, K]``."""
    # [N, K/2, 2]: low nibble first, then high
    return torch.stack((data & 15, data >> 4), dim=-1).flatten(1)[:, :num_cols]


def quantize(weight: torch.Tensor, bits: int, group_size: int | None) -> QuantizedWeight:
    """Quantize a float ``[N, K]`` weight: bits 8 symmetric (q in -127..127, no mins), bits 4 asymmetric (q in
    0..15 with mins); ``group_size`` None is one group per row."""
    if weight.dim() != 2 or not weight.dtype.is_floating_point:
        raise ValueError(f"weight must be a 2-D floating tensor [N, K], got {weight.dtype} {tuple(weight.shape)}")
    num_cols = weight.shape[1]
    group_size = group_size or num_cols
    groups = _grouped(weight.detach().to(torch.float32), group_size)  # [N, G, group_size]
    if bits == 8:
        scales = groups.abs().amax(dim=-1) / 127
        q = torch.round(groups / _nonzero(scales)[..., None]).clamp(-127, 127)
        mins = None
    else:
        mins = groups.amin(dim=-1)
        scales = (groups.amax(dim=-1) - mins) / 15
        q = torch.round((groups - mins[..., None]) / _nonzero(scales)[..., None]).clamp(0, 15)
    q = q.flatten(1)[:, :num_cols].to(torch.int8)
    return pack(q, scales, mins, group_size, bits)


def _grouped(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[N, K]`` -> ``[N, G, group_size]``; a short last group is padded with its own last value, which changes
    neither its min, max nor absolute max."""
    short = -weight.shape[1] % group_size
    if short:
        weight = torch.cat((weight, weight[:, -1:].expand(-1, short)), dim=1)
    return weight.reshape(weight.shape[0], -1, group_size)


def _nonzero(scales: torch.Tensor) -> torch.Tensor:
    """Scales as divisors: an all-constant group has scale 0 and quantizes to q = 0 (or its min) exactly."""
    return torch.where(scales == 0, torch.ones_like(scales), scales)


def dequantize(w: QuantizedWeight) -> torch.Tensor:
    """The float32 ``[N, K]`` weight."""
    ops = load_quant_ops()
    if ops is None:
        return dequantize_reference(w)
    return ops.dequantize(w.data, w.float_scales, w.float_mins, w.group_size, w.bits, w.shape[1], torch.float32)


def dequantize_reference(w: QuantizedWeight) -> torch.Tensor:
    """:func:`dequantize` in plain PyTorch: the reference the kernels are tested against, and their fallback."""
    num_cols = w.shape[1]
    q = w.data if w.bits == 8 else _unpack_nibbles(w.data, num_cols)
    # [N, G] -> [N, K]: each group's value repeated over its columns
    scales = w.float_scales.repeat_interleave(w.group_size, dim=1)[:, :num_cols]
    out = q.to(torch.float32) * scales
    if w.mins is not None:
        out += w.float_mins.repeat_interleave(w.group_size, dim=1)[:, :num_cols]
    return out


def quant_linear(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x w^T (+ bias)``: ``x`` ``[M, K]`` float32 or bfloat16 -> ``[M, N]`` in ``x.dtype``.

    Sums run in float32 and a bf16 result is rounded once. The fp32 kernel (up to :data:`MAX_STREAMING_ROWS`
    rows) and the tiled matmul (more rows, or no C++ kernels) multiply by ``w`` exactly; the bf16-dot kernel
    (bf16 x, :data:`BF16_DOTS_MIN_ROWS` rows or more, AVX512_BF16) first rounds ``w`` to bf16, as a dense bf16
    layer's weight is.
    """
    if x.dim() != 2 or x.shape[1] != w.shape[1] or x.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"x must be float32 or bfloat16 [M, {w.shape[1]}], got {x.dtype} {tuple(x.shape)}")
    ops = load_quant_ops()
    num_rows = x.shape[0]
    if ops is None:
        return _tiled_linear(x, w, bias, None)
    bf16_dots = x.dtype == torch.bfloat16 and num_rows >= BF16_DOTS_MIN_ROWS and has_bf16_dots()
    if bf16_dots or num_rows <= MAX_STREAMING_ROWS:
        return ops.linear(x, w.data, w.float_scales, w.float_mins, w.group_size, w.bits, w.shape[1], bias, bf16_dots)
    return _tiled_linear(x, w, bias, ops)


def _tiled_linear(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None, ops: object | None) -> torch.Tensor:
    """``x w^T`` over tiles of :data:`TILE_ROWS` rows of ``w``, each dequantized and multiplied by ``F.linear``,
    so no more than one tile of dense weight exists at a time. In float32 whatever x's dtype: oneDNN reorders a
    plain bf16 weight on every call, which made bf16 tiles many times slower."""
    num_rows = w.shape[0]
    x32 = x.to(torch.float32)
    out = torch.empty(x.shape[0], num_rows, dtype=torch.float32)
    for start in range(0, num_rows, TILE_ROWS):
        rows = slice(start, min(start + TILE_ROWS, num_rows))
        tile = _dequantize_rows(_rows(w, rows), torch.float32, ops)
        out[:, rows] = F.linear(x32, tile, None if bias is None else bias[rows].to(torch.float32))
    return out.to(x.dtype)


def _rows(w: QuantizedWeight, rows: slice | torch.Tensor) -> QuantizedWeight:
    """The weight restricted to some rows (a slice is a view; an index tensor gathers)."""
    def take(t: torch.Tensor) -> torch.Tensor:
        return t[rows] if isinstance(rows, slice) else t.index_select(0, rows)

    mins, min_supers, scale_supers = (None if t is None else take(t) for t in (w.mins, w.min_supers, w.scale_supers))
    data = take(w.data)
    return QuantizedWeight(data, take(w.scales), mins, w.group_size, w.bits, (data.shape[0], w.shape[1]),
                           scale_supers, min_supers)


def _dequantize_rows(w: QuantizedWeight, dtype: torch.dtype, ops: object | None) -> torch.Tensor:
    if ops is None or dtype not in (torch.float32, torch.bfloat16):
        return dequantize_reference(w).to(dtype)
    return ops.dequantize(w.data, w.float_scales, w.float_mins, w.group_size, w.bits, w.shape[1], dtype)


def quant_embedding(ids: torch.Tensor, w: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` (``[T]``) of the table ``w`` as ``[T, K]`` in ``dtype``: only those rows are dequantized."""
    return _dequantize_rows(_rows(w, ids.reshape(-1).to(torch.long)), dtype, load_quant_ops())
