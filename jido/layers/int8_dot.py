"""Linear layers by integer dot products: x rounded to int8 per block of 32 columns (or per token), times a
QuantizedWeight's codes.

Decode reads every weight once per step, so its speed is the weight bytes over the memory's bandwidth, if the
arithmetic keeps up. Widening each int8 / int4 code to float for an FMA (``quant_kernels``' streaming kernel)
costs ~12 instructions per 32 weights and left the bandwidth half used; multiplying the codes by int8
activations takes 3-5 (AVX2 ``maddubs`` + ``madd``, or AVX-512 VNNI ``vpdpbusd``), as llama.cpp and vLLM's GGUF
kernels do. Prefill is compute-bound, and there the same products run 2-4x more of them per instruction than
float32 FMAs. The price is rounding x: each block of 32 is scaled by ``max |x| / 127`` (llama.cpp's Q8_0
activations; ``per_token``: one scale per row, vLLM's w8a8), and the mins' term of asymmetric weights sums the
rounded x too. Every row is rounded alone, the same way at any number of rows, so a request's result does not
depend on what else is in its step.

Two C++ kernels (``csrc/int8_dot*.cpp``, one unit per ISA) share that rounding: the rows kernel streams the weight
in place for a few rows of x, the panel kernel repacks 8 weight rows at a time into a scratch panel that serves every
row of x (from :data:`PANEL_MIN_ROWS` rows). A model's layers pack their panels once at load (:class:`PackedPanels`,
:func:`panel_linear`) and run every step of :data:`PREPACKED_MIN_ROWS` rows or more on them; one-row decode
stays on the rows kernel. A row's output is then the same in any step of two rows or more, and differs from
its one-row result by float32 sums in another order. Each kernel holds an AVX2 and an AVX-512 VNNI version; the
library says which ISAs this CPU runs (:func:`cpu_isas`) and the widest is used. On CPUs with AMX-INT8 the prepacked
panels hold 16 weight rows for the tile units instead (:func:`amx_runs`): the same integer sums and float operations,
so the same bits.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from jido.layers.quant_kernels import QuantizedWeight, dequantize_reference
from jido.utils.cpp_build import load_ops_library
from jido.utils.cpu import CpuInfo, cpu_info

CSRC = Path(__file__).parent / "csrc"
# The library's units: the ops and glue, then one per ISA (int8_dot_common.h says what they share).
SOURCES = tuple(CSRC / name for name in ("int8_dot.cpp", "int8_dot_avx2.cpp", "int8_dot_vnni.cpp", "int8_dot_amx.cpp"))
BLOCK = 32  # columns of x per scale
# The vector kernels' ISAs, in the order of the C++ `isa` argument.
ISAS = ("avx2", "avx512_vnni")
# From this many rows of x on, the panel kernel (below it, the rows kernel) when the panels are packed per call.
PANEL_MIN_ROWS = 8
# Prepacked panels (PackedPanels) serve every step of at least this many rows. One row stays on the rows kernel:
# the panels hold int4 codes as bytes, so a one-row step, bound by the bytes it reads, ran slower on them; from two
# rows on, the panels won every shape (benchmarks/results/prepacked_panels-2026-12-01-avx2-epyc.md).
PREPACKED_MIN_ROWS = 2
# w8a8 steps of this many rows or more run as one int8 GEMM (int_mm_linear) rather than on the panels: on a Zen 4
# with AVX-512 VNNI the GEMM won or tied on Gemma 3 270M's shapes from 64 rows, and below 64 the panels won or tied
# on every shape but qkv (benchmarks/results/report-2026-12-04-zen4-w8a8-int-mm.md).
INT_MM_MIN_ROWS = 64
# w8a8 steps of at least this many rows run on jido's AMX int8 GEMM (amx_gemm_linear) where it runs; fewer stay on
# the AMX panels: on the default model's layer linears (w8a8 weights) the panels won at 16 rows and the GEMM from
# 32 (benchmarks/results/int8_gemm-2026-12-05-amx-xeon.md).
AMX_GEMM_MIN_ROWS = 32


def dot_isa(cpu: CpuInfo) -> str | None:
    """The int8 dot-product kernel a CPU with these flags runs: ``avx512_vnni`` (vpdpbusd), ``avx2`` (maddubs), or
    None; for planning before the library is built (the loaded library's own answer is :func:`cpu_isas`)."""
    if {"avx512_vnni", "avx512vl"} <= cpu.flags:
        return "avx512_vnni"
    if {"avx2", "fma", "f16c"} <= cpu.flags:
        return "avx2"
    return None


@functools.cache
def load_int8_dot_ops(sources: tuple[Path, ...] = SOURCES) -> object | None:
    """``torch.ops.jido_int8_dot`` built from ``sources`` when this CPU runs one of its vector kernels, else None."""
    if dot_isa(cpu_info()) is None or not load_ops_library("jido_int8_dot", sources, "C++ int8 dot-product kernels",
                                                           "the float kernels"):
        return None
    ops = torch.ops.jido_int8_dot
    return ops if set(ops.isas()) & set(ISAS) else None


@functools.cache
def cpu_isas() -> frozenset[str]:
    """The ISAs the built library says this CPU runs (C++ ``cpu_runs``, its one check of the CPU): ``avx2``,
    ``avx512_vnni``, ``amx`` (AMX-INT8, with the tile state granted to this process), ``avx512_bf16``; none where the
    kernels are not built."""
    ops = load_int8_dot_ops()
    return frozenset(ops.isas()) if ops is not None else frozenset()


@functools.cache
def _isa_index() -> int:
    """The C++ ``isa`` argument for the widest vector kernel this CPU runs (see :func:`cpu_isas`)."""
    return max(ISAS.index(isa) for isa in cpu_isas() & set(ISAS))


def supports(w: QuantizedWeight) -> bool:
    """Whether the kernels take ``w``'s groups (see :func:`takes_groups`)."""
    return takes_groups(w.group_size, w.shape[1])


def takes_groups(group_size: int, num_cols: int) -> bool:
    """Whether the kernels take groups of ``group_size`` of a row of ``num_cols``: 16 columns, a multiple of 32, or a
    whole row."""
    return group_size == 16 or group_size % BLOCK == 0 or group_size >= num_cols


def runs(w: QuantizedWeight) -> bool:
    """The kernels are built for this CPU and take ``w``."""
    return supports(w) and load_int8_dot_ops() is not None


def int8_dot_linear(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None, per_token: bool = False,
                    panels: bool | None = None) -> torch.Tensor:
    """``x w^T (+ bias)`` with x rounded to int8 per block, or per row with ``per_token`` (see the module
    docstring), in ``x.dtype``; by the panel kernel from :data:`PANEL_MIN_ROWS` rows unless ``panels`` says.

    Needs :func:`load_int8_dot_ops` to have built and :func:`supports` to accept ``w``.
    """
    ops = load_int8_dot_ops()
    if panels is None:
        panels = x.shape[0] >= PANEL_MIN_ROWS
    return ops.linear(x, w.data, w.scales, w.mins, w.group_size, w.bits, w.shape[1], bias,
                      _isa_index(), 0 if per_token else BLOCK, panels, w.scale_supers, w.min_supers)


@dataclass(frozen=True)
class PackedPanels:
    """A weight's panels packed once for the panel kernel (``csrc/int8_dot.cpp``, ``pack_all_panels``), for x
    rounded per block of 32 or, with ``per_token``, per row: the scales are laid out per chunk of columns that
    share one scale of each. With ``amx``, 16-row panels for the AMX tile kernel (``pack_all_amx_panels``)."""

    # uint8 [panels, rows * padded K], rows 8 (amx: 16) weight rows a panel; AMX panels whose codes all span at most
    # 63 values hold them narrow instead, in 4, 5 or 6 bits (:attr:`code_bits`)
    codes: torch.Tensor
    scales: torch.Tensor  # float32 [panels, chunks * rows]
    mins: torch.Tensor  # float32 [panels, groups * rows], or empty when no panel has a mins' term
    meta: torch.Tensor  # int32 [panels, 2]: each panel's span of codes and whether it has a mins' term
    group_size: int
    shape: tuple[int, int]  # (N, K)
    per_token: bool
    amx: bool = False

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mins, self.meta))

    @property
    def code_bits(self) -> int:
        """Bits per code as stored: 8 (a byte each), or 4-6 for narrow AMX panels (``csrc/int8_dot.cpp``,
        ``narrow_unit_bytes``: per 128 codes 64 bytes of nibbles and 16 bytes per bit past the fourth)."""
        rows = 16 if self.amx else 8
        padded_k = -(-self.shape[1] // BLOCK) * BLOCK
        per_unit = self.codes.shape[1] * 128 // (rows * padded_k)
        return 8 if per_unit == 128 else 4 + (per_unit - 64) // 16

    @property
    def with_mins(self) -> list[bool]:
        """Whether each panel has a mins' term."""
        return [bool(v) for v in self.meta[:, 1].tolist()]


@functools.cache
def amx_runs() -> bool:
    """Whether prepacked panels run on AMX tiles here: the C++ kernels built, the CPU has AMX-INT8 and Linux gave this
    process its tile state. There the tiles beat the AVX-512 VNNI panels on the LM head, on the layers and on a whole
    decode step, more so the more rows (benchmarks/results/amx_panels-2026-12-04-amx-xeon.md)."""
    return "amx" in cpu_isas()


def pack_panels(w: QuantizedWeight, per_token: bool = False, amx: bool | None = None,
                narrow: bool = True) -> PackedPanels:
    """``w``'s panels packed once, for :func:`panel_linear` with the same ``per_token``: for the AMX tile kernel
    where it runs (``amx`` None: :func:`amx_runs`), else for the vector one. AMX panels hold codes that span at most
    63 values in 4-6 bits (:attr:`PackedPanels.code_bits`) unless ``narrow`` is False (bytes, as the vector panels)."""
    ops = load_int8_dot_ops()
    x_block = 0 if per_token else BLOCK
    amx = amx_runs() if amx is None else amx
    if amx:
        tensors = ops.pack_amx_panels(w.data, w.scales, w.mins, w.group_size, w.bits, w.shape[1], x_block, narrow,
                                      w.scale_supers, w.min_supers)
    else:
        tensors = ops.pack_panels(w.data, w.scales, w.mins, w.group_size, w.bits, w.shape[1], _isa_index(), x_block,
                                  w.scale_supers, w.min_supers)
    return PackedPanels(*tensors, w.group_size, w.shape, per_token, amx)


def panel_linear(x: torch.Tensor, panels: PackedPanels, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x w^T (+ bias)`` by the panel kernel over prepacked panels: what ``int8_dot_linear(x, w, bias,
    per_token, panels=True)`` gives, bit for bit, without packing w on every call."""
    n, k = panels.shape
    x_block = 0 if panels.per_token else BLOCK
    ops = load_int8_dot_ops()
    if panels.amx:
        return ops.amx_panel_linear(x, panels.codes, panels.scales, panels.mins, panels.meta, n, k, panels.group_size,
                                    bias, x_block)
    return ops.panel_linear(x, panels.codes, panels.scales, panels.mins, panels.meta, n, k, panels.group_size, bias,
                            _isa_index(), x_block)


def panel_argmax(x: torch.Tensor, panels: PackedPanels, bias: torch.Tensor | None = None,
                 allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's ``argmax`` of ``panel_linear(x.float(), panels, bias)`` ([M] int64: the first column of the largest
    value, or of the first NaN, as ``torch.argmax``) from vector panels, without the outputs: a greedy step's LM head
    then neither writes its logits nor reads them back. The float32 logits whatever x's dtype, as ``compute_logits``
    hands them to the sampler: logits of a bf16 model that round to one bf16 value are still told apart.

    ``allowed`` (int32 ``[M, words]``): each row's grammar bitmask; the argmax is then over the columns it allows, as
    the sampler's after ``apply_token_bitmask`` (banned columns count as -inf)."""
    if panels.amx:
        raise ValueError("panel_argmax takes vector panels; AMX panels have amx_panel_argmax")
    n, k = panels.shape
    return load_int8_dot_ops().panel_argmax(x, panels.codes, panels.scales, panels.mins, panels.meta, n, k,
                                            panels.group_size, bias, _isa_index(), 0 if panels.per_token else BLOCK,
                                            allowed)


def amx_panel_argmax(x: torch.Tensor, panels: PackedPanels, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's ``argmax`` of ``panel_linear(x.float(), panels, bias)`` ([M] int64: the first column of the largest
    value, or of the first NaN, as ``torch.argmax``) from AMX panels, without the outputs: a greedy step's LM head
    then neither writes its logits nor reads them back, [rows, vocab] floats that were a visible share of a step
    (benchmarks/results/report-2026-12-05-amx-xeon-decode-kernels.md)."""
    if not panels.amx:
        raise ValueError("amx_panel_argmax needs AMX panels (pack_panels with amx)")
    n, k = panels.shape
    return load_int8_dot_ops().amx_panel_argmax(x, panels.codes, panels.scales, panels.mins, panels.meta, n, k,
                                                panels.group_size, bias, 0 if panels.per_token else BLOCK)


def takes_int_mm(w: QuantizedWeight) -> bool:
    """Whether ``w`` can run as one int8 GEMM (:func:`int_mm_linear`): int8 codes scaled per output row only (no mins),
    as ``w8a8`` makes them."""
    return w.bits == 8 and w.mins is None and w.group_size >= w.shape[1]


@dataclass(frozen=True)
class AmxGemmWeight:
    """A :func:`takes_int_mm` weight's codes packed once for the AMX int8 GEMM (``csrc/int8_dot.cpp``, ``amx::gemm``):
    blocks of 32 output columns, one tile multiply's codes 1 KiB in a row. ``gated``: a merged gate/up weight whose
    blocks pair 16 gate columns with their 16 up columns, for the activation fused into the products' store."""

    packed: torch.Tensor  # int8 [blocks, K / 64 * 2048]
    scales: torch.Tensor  # float32 [N]
    shape: tuple[int, int]  # (N, K)
    gated: bool = False


def takes_amx_gemm(w: QuantizedWeight) -> bool:
    """Whether ``w`` runs as :func:`amx_gemm_linear` here: a :func:`takes_int_mm` weight whose K is a multiple of 64
    (a tile multiply's), where the panels run on AMX tiles."""
    return takes_int_mm(w) and w.shape[1] % 64 == 0 and amx_runs()


def pack_amx_gemm(w: QuantizedWeight, gated: bool = False) -> AmxGemmWeight:
    """``w``'s codes packed for :func:`amx_gemm_linear` (it must :func:`takes_amx_gemm`); ``gated`` for
    :func:`amx_gemm_gated` on a merged gate/up weight (gate rows first)."""
    packed = load_int8_dot_ops().pack_amx_gemm(w.data, gated)
    return AmxGemmWeight(packed, w.scales.reshape(-1).float().contiguous(), tuple(w.shape), gated)


def amx_gemm_linear(x: torch.Tensor, w: AmxGemmWeight, bias: torch.Tensor | None = None,
                    channel_scale: torch.Tensor | None = None) -> torch.Tensor:
    """What :func:`int_mm_linear` gives (the same codes, exact int32 sums, the same two scale products in the same
    order; with a bias, up to its fused add), by jido's int8 GEMM on AMX tiles. oneDNN's int8 GEMM ran slower than
    its bf16 one on an AMX Xeon, where tile multiplies of int8 carry twice bf16's products per byte loaded
    (benchmarks/results/int8_gemm-2026-12-05-amx-xeon.md)."""
    if w.gated:
        raise ValueError("a gated packing runs through amx_gemm_gated")
    out = _amx_gemm(x, w, bias, -1, channel_scale)
    return out if out.dtype == x.dtype else out.to(x.dtype)


def amx_gemm_gated(x: torch.Tensor, w: AmxGemmWeight, act: int, bias: torch.Tensor | None = None,
                   channel_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``act(gate) * up`` of a bf16 ``x`` through a gated packing (``act`` 0 SiLU, 1 GELU's tanh form, as
    ``act_and_mul`` numbers them): bit for bit what :func:`int_mm_linear` and then ``act_and_mul`` give without a
    bias (the products rounded to bf16, then the same float32 arithmetic), with neither the [N, 2 x I] products
    written and read back nor a second kernel."""
    if not w.gated or x.dtype != torch.bfloat16:
        raise ValueError("amx_gemm_gated takes a gated packing and bf16 x")
    return _amx_gemm(x, w, bias, act, channel_scale)


def _amx_gemm(x: torch.Tensor, w: AmxGemmWeight, bias: torch.Tensor | None, act: int,
              channel_scale: torch.Tensor | None) -> torch.Tensor:
    """x rounded per token, times ``w`` on the tiles (``act`` -1: none), out in bf16 for bf16 x, else float32."""
    ops = load_int8_dot_ops()
    codes, x_scales = ops.quantize_per_token(x, channel_scale)
    return ops.amx_gemm(codes, x_scales, w.packed, w.scales, bias, w.shape[0], x.dtype == torch.bfloat16, act)


def int_mm_linear(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None,
                  channel_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x w^T (+ bias)`` in ``x.dtype`` for a weight that :func:`takes_int_mm`, x rounded per token as the kernels
    round it, by one int8 GEMM: ``torch._int_mm`` (oneDNN; exact int32 sums), its sums scaled back per row and
    column. What ``int8_dot_linear(x, w, bias, per_token=True)`` gives, up to the order of the two scale products.
    ``channel_scale`` (float32 [K], holding values of x's dtype): x * channel_scale in x's dtype is rounded instead,
    in the same pass (w8a8's smoothing; the GEMM routes take it too).

    Prefill is compute-bound, and oneDNN's int8 GEMM outran bf16 on a Zen 4 with AVX-512 VNNI, where the panel
    kernel ran about bf16's rate (benchmarks/results/report-2026-12-04-zen4-w8a8-int-mm.md).
    """
    return _int_mm(x, w, bias, -1, channel_scale)


def int_mm_gated(x: torch.Tensor, w: QuantizedWeight, act: int, bias: torch.Tensor | None = None,
                 channel_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``act(gate) * up`` of a bf16 ``x`` times a merged gate/up weight (gate rows first) that :func:`takes_int_mm`
    (``act`` 0 SiLU, 1 GELU's tanh form): bit for bit :func:`int_mm_linear` and then ``act_and_mul``, the sums scaled
    into the activation's product in one pass (:func:`int_mm_fuses_gated` must hold)."""
    if x.dtype != torch.bfloat16 or not int_mm_fuses_gated():
        raise ValueError("int_mm_gated takes bf16 x, on a CPU with AVX-512 BF16")
    return _int_mm(x, w, bias, act, channel_scale)


@functools.cache
def int_mm_fuses_gated() -> bool:
    """Whether :func:`int_mm_gated` runs here (its bf16 epilogue needs AVX-512 BF16)."""
    return "avx512_bf16" in cpu_isas()


def _int_mm(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None, act: int,
            channel_scale: torch.Tensor | None) -> torch.Tensor:
    """x rounded per token, times ``w`` by ``torch._int_mm``; for bf16 x on a CPU with AVX-512 BF16 the sums scaled
    straight into bf16 (with ``act`` >= 0 into the gated product), else into float32 and then x's dtype."""
    ops = load_int8_dot_ops()
    codes, x_scales = ops.quantize_per_token(x, channel_scale)
    sums = torch._int_mm(codes, w.data.t())
    if x.dtype == torch.bfloat16 and int_mm_fuses_gated():
        return ops.scale_sums(sums, x_scales, w.scales.reshape(-1), bias, True, act)
    return ops.scale_sums(sums, x_scales, w.scales.reshape(-1), bias).to(x.dtype)


@dataclass(frozen=True)
class FiveBitRows:
    """A weight whose int8 codes all lie in -16..15 (GGUF's Q5_0) stored in five bits for the one-row decode
    kernel (``csrc/int8_dot.cpp``, FiveBitWeight), u = q + 16: per pair of blocks of 32 codes, 32 bytes of low
    nibbles (column j of the first block in the low half of byte j, of the second in its high half), then each
    block's 4 bytes of fifth bits; a last unpaired block as 16 bytes of nibbles (column j in byte j's low half,
    j + 16 in its high half), then its fifth bits. A block's fifth bit of column 4 * i + b is bit 8 * b + i of its
    32-bit word. 20 bytes a block against 32: decode streams 0.625 of the bytes.

    The layout is the one the AVX2 kernel unpacks in fewest instructions: on the AVX2 EPYC (Zen 3) one-row decode on
    these rows is compute-bound (about as fast from memory as from cache), so the unpacking sets its speed; it uses
    16-byte nibble loads and fifth bits spread by a byte shuffle and compare
    (benchmarks/results/report-2026-12-03-avx2-epyc-fast-avx2.md). Scales and mins are the weight's own tensors."""

    data: torch.Tensor  # uint8 [N, K / 32 * 20]
    scales: torch.Tensor  # the QuantizedWeight's
    mins: torch.Tensor | None
    group_size: int
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.data.numel()


def fits_five_bits(w: QuantizedWeight) -> bool:
    """Whether ``w`` can be held as :class:`FiveBitRows`: int8 codes in -16..15, K a multiple of 32, groups of whole
    blocks of 32."""
    if w.bits != 8 or w.shape[1] % BLOCK or not (w.group_size % BLOCK == 0 or w.group_size >= w.shape[1]):
        return False
    if w.scale_supers is not None:  # (five-bit rows read float scales)
        return False
    return w.data.numel() > 0 and int(w.data.min()) >= -16 and int(w.data.max()) <= 15


def pack_five_bits(w: QuantizedWeight) -> FiveBitRows:
    """``w`` (which :func:`fits_five_bits`) in five bits."""
    num_rows, num_cols = w.shape
    num_blocks = num_cols // BLOCK
    u = (w.data.to(torch.int16) + 16).to(torch.uint8).view(num_rows, num_blocks, BLOCK)
    # each block's word: bit 8 * b + i (byte b, bit i) is the fifth bit of column 4 * i + b
    high = (u >> 4).view(num_rows, num_blocks, 8, 4).transpose(-1, -2)  # [..., b, i]
    weights = (1 << torch.arange(8, dtype=torch.int32)).to(torch.uint8)
    fifth = (high * weights).sum(dim=-1, dtype=torch.int32).to(torch.uint8)  # [N, blocks, 4]
    paired = num_blocks // 2 * 2
    first, second = u[:, 0:paired:2] & 15, u[:, 1:paired:2] & 15
    pairs = torch.cat([first | (second << 4), fifth[:, 0:paired:2], fifth[:, 1:paired:2]], dim=-1)
    parts = [pairs.reshape(num_rows, -1)]
    if paired < num_blocks:  # the last block alone
        last = u[:, -1]
        parts.append(torch.cat([(last[:, :16] & 15) | ((last[:, 16:] & 15) << 4), fifth[:, -1]], dim=-1))
    return FiveBitRows(torch.cat(parts, dim=-1).contiguous(), w.scales, w.mins, w.group_size, w.shape)


def five_bit_linear(x: torch.Tensor, rows: FiveBitRows, bias: torch.Tensor | None = None,
                    per_token: bool = False) -> torch.Tensor:
    """``x w^T (+ bias)`` for one row of x on :class:`FiveBitRows`: bit for bit what ``int8_dot_linear`` gives on the
    weight's int8 codes, reading 0.625 of their bytes."""
    return load_int8_dot_ops().five_bit_linear(x, rows.data, rows.scales, rows.mins, rows.group_size, rows.shape[1],
                                               bias, _isa_index(), 0 if per_token else BLOCK)


def quantize_activations(x: torch.Tensor, per_token: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' rounding of x ``[M, K]``: int8 codes ``[M, K]`` and float32 scales ``[M, ceil(K / 32)]`` (with
    ``per_token``, every block of a row holds the row's scale), ``x ~= codes * scales`` per block, bit for bit
    what the C++ kernels compute."""
    x = x.to(torch.float32)
    num_cols = x.shape[1]
    blocks = F.pad(x, (0, -num_cols % BLOCK)).reshape(x.shape[0], -1, BLOCK)  # [M, nb, 32]
    scales = blocks.abs().amax(dim=-1) / 127
    if per_token:
        scales = scales.amax(dim=-1, keepdim=True).expand_as(scales).contiguous()
    inverse = torch.where(scales != 0, 1 / scales, torch.zeros_like(scales))
    codes = torch.round(blocks * inverse[..., None]).to(torch.int8).flatten(1)[:, :num_cols]
    return codes, scales


def rounded_activations(x: torch.Tensor, per_token: bool = False) -> torch.Tensor:
    """x as the kernels see it, in float64: ``codes * scales`` of :func:`quantize_activations`."""
    codes, scales = quantize_activations(x, per_token)
    return codes.double() * scales.double().repeat_interleave(BLOCK, dim=1)[:, :x.shape[1]]


def int8_dot_linear_reference(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None,
                              per_token: bool = False) -> torch.Tensor:
    """What :func:`int8_dot_linear` computes, in float64: the rounded x times the dequantized weight."""
    out = rounded_activations(x, per_token) @ dequantize_reference(w).double().T
    return out if bias is None else out + bias.double()
