"""Weight-quantized linear layers, embedding and LM head: GGUF codes kept as stored, or int8/int4 made at load.

Each quantized layer ends up holding one :class:`~jido.layers.quant_kernels.QuantizedWeight` as ``qweight``
(``w = scale * q + offset`` per group of a row) and no float copy of it; the copies of those codes in other layouts,
its SmoothQuant state and its kernel route sit in one :class:`~jido.layers.quantized_layouts.QuantizedLayouts`
(``layer.layouts``). The matmuls run on the codes by integer dot products (:mod:`jido.layers.int8_dot`: x rounded
to int8 per block of 32, or per token under ``w8a8``) at every number of rows, so a request's result does not depend
on the rest of its step; where those kernels do not run (no AVX2, no compiler), by :mod:`jido.layers.quant_kernels`
on x as it is (``w8a8``: x rounded per token first). The embedding gathers from the same codes. Two ways in:

- ``gguf``: the loader hands each GGUF tensor over still quantized, as :class:`QuantizedCodes`; a merged
  projection (q/k/v, gate/up) joins its shards' codes, which may come from different GGML types.
- ``int8`` / ``int4`` / ``w8a8``: a float checkpoint loads as usual and is quantized once loaded (int8
  symmetric per output channel unless a group size is given; int4 asymmetric in groups, 32 by default; w8a8
  int8 per output channel, vLLM's scheme).
- ``gguf_w8a8``: ``gguf``'s codes for decode, and for prefill-sized steps on AMX a w8a8 copy of each layer (its
  dequantized weight smoothed, int8 per output channel, x rounded per token) in place of ``gguf``'s bf16 copy.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch import nn

from jido.layers import int8_dot, quant_kernels
from jido.layers.activation import fused_activation_code
from jido.layers.parameter import WeightLoader
from jido.layers.quantization import (LinearMethod, QuantizationConfig, UnquantizedLinearMethod, pack_dense,
                                     packed_linear)
from jido.layers.quant_kernels import QuantizedWeight
from jido.layers.quantized_layouts import QuantizedLayouts
from jido.layers.weight_plan import (AMX_GEMM, BF16_COPY, FIVE_BITS, PANELS, PREFILL_INT8, LayoutCosts,
                                     WeightPlan)
from jido.utils.cpu import cpu_info

logger = logging.getLogger(__name__)

DEFAULT_INT4_GROUP_SIZE = 32  # llama.cpp's Q4_0 group: int4 with larger groups loses visibly more
TABLE_GROUP_SIZE = 32  # int4's embedding table in int8: Q8_0's groups
# Steps of this many rows or more multiply a layer's bf16 copy (see keeps_bf16_copy) rather than its codes.
# From 16 rows oneDNN's bf16 matmul outruns the int8 panels (on a Xeon with AMX, Gemma 3 270M's GGUF layers), and
# the lead grows with the rows; below that the two are even with the weights in cache, and from memory the copy
# reads twice the bytes, so the panels keep steps of 2-15 rows.
BF16_COPY_MIN_ROWS = 16
# The same where the panels run on AMX tiles (int8_dot.amx_runs): there the panels win with the weights from memory
# up to 32 rows and the bf16 copies from 48 (benchmarks/results/amx_panels-2026-12-04-amx-xeon.md).
BF16_COPY_MIN_ROWS_AMX = 40
# Without AMX, steps of BF16_COPY_MIN_ROWS up to PANEL_MAX_ROWS_VNNI rows stay on the panels (AVX-512 VNNI pairs)
# where x rounded (a byte a column) is at most PANEL_X_MAX_BYTES_VNNI: on a Zen 4 EPYC the panels beat the copy
# while x stays small (qkv and gate/up, K 640, up to 32 rows) and lose once it grows (o and down, K 1,024 and more)
# (benchmarks/panels_vs_copy.py; benchmarks/results/panels_vs_copy-2026-12-06-zen4.md).
PANEL_X_MAX_BYTES_VNNI = 20 << 10
PANEL_MAX_ROWS_VNNI = 32
# The rows the AMX case's copy is packed for: a full step of the default max_num_batched_tokens.
BF16_COPY_ROWS_HINT_AMX = 2048
# gguf_w8a8's int8 copy takes over from the GGUF panels where the bf16 copy would: steps of decode size keep the
# file's codes (and their numbers), prefill-sized ones round x per token. That is on AMX tiles; without AMX the copy
# runs on oneDNN's int8 GEMM (int_mm_linear) from int8_dot.INT_MM_MIN_ROWS, and the bf16 copy keeps the steps
# from bf16_copy_min_rows up to that, as under gguf.
PREFILL_W8A8_MIN_ROWS = BF16_COPY_MIN_ROWS_AMX
# The kernels a bound layer (see QuantizedLinearMethod._bind) runs a step on: gguf_w8a8's int8 prefill copy, the bf16
# copy, the AMX int8 GEMM, oneDNN's int8 GEMM on w8a8's codes, the prepacked panels, panels packed for the call (a
# layer the weight plan gave none), five-bit rows, the rows kernel.
(_ON_PREFILL_INT_MM, _ON_BF16_COPY, _ON_AMX_GEMM, _ON_INT_MM, _ON_PANELS, _ON_CALL_PANELS, _ON_FIVE_BITS,
 _ON_ROWS) = range(8)


@dataclass(frozen=True)
class QuantizedCodes:
    """A checkpoint tensor still quantized: ``w[r, k] = scales[r, k // group_size] * q[r, k] + offsets[...]``."""

    q: torch.Tensor  # int8 [rows, cols]
    scales: torch.Tensor  # float32 [rows, ceil(cols / group_size)]
    offsets: torch.Tensor | None  # float32 like scales, or None
    group_size: int
    source: str  # the stored type, e.g. "Q5_0" (for logs)
    # K-quants: each super-block's factor of the scales (d) and of the offsets (-dmin), float32 [rows, cols / 256]
    # (gguf_blocks.GroupCodes), for pack to hold the group scales as small integers; None: none known
    scale_supers: torch.Tensor | None = None
    offset_supers: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)  # type: ignore[return-value]

    def to_group_size(self, group_size: int) -> QuantizedCodes:
        """The same values described with smaller groups (``group_size`` divides this one's)."""
        repeat = self.group_size // group_size
        if repeat == 1:
            return self
        offsets = None if self.offsets is None else self.offsets.repeat_interleave(repeat, dim=1)
        return QuantizedCodes(self.q, self.scales.repeat_interleave(repeat, dim=1), offsets, group_size, self.source,
                              self.scale_supers, self.offset_supers)  # (per super-block of columns: the same)

    def dequantize(self) -> torch.Tensor:
        """float32 ``[rows, cols]``."""
        return quant_kernels.dequantize(self.pack(bits=8))

    def pack(self, bits: int | None = None) -> QuantizedWeight:
        """The kernel's weight: 4-bit when every code fits 0..15 (or ``bits=4`` is forced), else 8-bit."""
        if bits is None:
            bits = 4 if int(self.q.min()) >= 0 and int(self.q.max()) <= 15 else 8
        return quant_kernels.pack(self.q, self.scales, self.offsets, self.group_size, bits, self.scale_supers,
                                  self.offset_supers)


def merge_codes(parts: list[QuantizedCodes]) -> QuantizedCodes:
    """Stack shards (rows) of possibly different types into one: common group size, zero offsets where absent."""
    group_size = math.gcd(*(part.group_size for part in parts))
    parts = [part.to_group_size(group_size) for part in parts]
    if any(part.offsets is not None for part in parts):
        offsets = torch.cat([torch.zeros_like(p.scales) if p.offsets is None else p.offsets for p in parts])
    else:
        offsets = None
    sources = "+".join(dict.fromkeys(part.source for part in parts))
    return QuantizedCodes(torch.cat([p.q for p in parts]), torch.cat([p.scales for p in parts]), offsets,
                          group_size, sources, *_merged_supers(parts, offsets is not None))


def _merged_supers(parts: list[QuantizedCodes], offsets: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The merged codes' super-block factors: every part's (a part without offsets gets zeros, its offsets being
    zeros), or none where a part has none."""
    if any(p.scale_supers is None or (p.offsets is not None and p.offset_supers is None) for p in parts):
        return None, None
    scale_supers = torch.cat([p.scale_supers for p in parts])
    if not offsets:
        return scale_supers, None
    return scale_supers, torch.cat([torch.zeros_like(p.scale_supers) if p.offset_supers is None else p.offset_supers
                                    for p in parts])


class QuantizedLinearMethod(LinearMethod):
    """Keeps a layer's weight as ``qweight`` once loaded; layers that got no codes under ``gguf`` stay dense.

    ``bits`` None keeps checkpoint codes as they are (``gguf``); 8 or 4 quantizes a float weight at load.
    ``per_token`` rounds x once per row (``w8a8``) instead of per block of 32.
    ``panel_min_rows``: steps of this many rows or more run on the prepacked panels; a model's one-row decode stays
    on the rows kernel (see ``int8_dot.PREPACKED_MIN_ROWS``). A draft takes the panels from one row: its codes are
    int8 (the panels hold them at the same bytes) or int4, and on AMX tiles its one-row layers ran faster there
    than on the rows kernel (benchmarks/results/spec_decode-2026-12-05-amx-xeon.md).
    ``prefill_w8a8`` (``gguf_w8a8``): in a bf16 model where the int8 kernels run, prefill-sized steps run as w8a8 on
    an int8 copy of the dequantized weight, smoothed as w8a8 is (:meth:`smooth`): on AMX tiles from
    :data:`PREFILL_W8A8_MIN_ROWS` rows (the layouts' ``amx_gemm``), elsewhere on oneDNN's int8 GEMM from
    ``int8_dot.INT_MM_MIN_ROWS`` (``prefill_int_mm``); the codes (and a bf16 copy, where ``gguf`` keeps one) serve the
    rest as under ``gguf``.
    ``plan``: which of those copies (panels, five-bit rows, the int8 and bf16 copies) the layer may hold
    (:mod:`jido.layers.weight_plan`); every one by default. Without panels, steps of two rows or more pack them per
    call: the same sums, so the same outputs. A batch-invariant plan runs every step on the panels, one row too.
    """

    def __init__(self, bits: int | None, group_size: int | None, per_token: bool = False,
                 panel_min_rows: int = int8_dot.PREPACKED_MIN_ROWS, prefill_w8a8: bool = False,
                 plan: WeightPlan | None = None) -> None:
        self.bits = bits
        self.group_size = group_size
        self.per_token = per_token
        self.panel_min_rows = panel_min_rows
        self.prefill_w8a8 = prefill_w8a8
        self.plan = plan or WeightPlan()
        self.dense = UnquantizedLinearMethod(self.plan.batch_invariant)

    def create_weights(
        self, layer: nn.Module, in_features: int, out_features: int, weight_loader: WeightLoader
    ) -> None:
        # The dense weight is never written when codes arrive: its untouched pages cost no memory.
        self.dense.create_weights(layer, in_features, out_features, _staging_loader(layer, weight_loader))
        layer.staged_codes = {}
        layer.layouts = QuantizedLayouts()

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        layouts = layer.layouts
        bound = layouts.linear
        if bound is not None:  # the int8 kernels' route, settled at load (see _bind)
            return bound(x, bias)
        if layouts.smooth_inv is not None:
            x = x * layouts.smooth_inv
        qweight = getattr(layer, "qweight", None)
        if qweight is None:
            return self.dense.apply(layer, x, bias)
        copy = layouts.bf16_copy
        if copy is not None and x.shape[0] >= layouts.bf16_copy_min_rows and x.dtype == torch.bfloat16:
            return packed_linear(x, copy, bias)
        if layouts.panels is not None and x.shape[0] >= self.panel_min_rows:
            return int8_dot.panel_linear(x, layouts.panels, bias)
        if layouts.five_bits is not None and x.shape[0] == 1:
            return int8_dot.five_bit_linear(x, layouts.five_bits, bias, self.per_token)
        if int8_dot.runs(qweight):
            return int8_dot.int8_dot_linear(x, qweight, bias, self.per_token)
        if self.per_token:
            x = int8_dot.rounded_activations(x, per_token=True).to(x.dtype)
        return quant_kernels.quant_linear(x, qweight, bias)

    def apply_logits(self, layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if getattr(layer, "qweight", None) is None:
            return self.dense.apply_logits(layer, hidden)
        # In float32: the kernels sum in float32 and the sampler reads float32, so a bf16 model's logits skip
        # rounding to bf16 and the two [rows, vocab] copies there and back, a visible share of a decode step.
        return self.apply(layer, hidden.float())

    def apply_gated(self, layer: nn.Module, x: torch.Tensor, activation: str,
                    bias: torch.Tensor | None = None) -> torch.Tensor | None:
        # w8a8 steps of many rows: on AMX tiles where the layer was packed gated (it told us its activation), else on
        # torch._int_mm with the activation applied as its sums are scaled. The row count first: every decode step of
        # every MLP asks, and leaves here. A layer under calibration takes every step through apply (observe_inputs).
        rows, layouts = x.shape[0], layer.layouts
        if rows < self._gemm_min_rows() or x.dtype != torch.bfloat16 or layouts.observing or self.plan.batch_invariant:
            return None
        act = fused_activation_code(activation)
        if act is None:
            return None
        channel_scale, gemm = layouts.gemm_channel_scale, layouts.amx_gemm
        if gemm is not None:
            return int8_dot.amx_gemm_gated(x, gemm, act, bias, channel_scale) if gemm.gated else None
        weight = self._int_mm_weight(layer)
        if weight is None or rows < int8_dot.INT_MM_MIN_ROWS or not int8_dot.int_mm_fuses_gated():
            return None
        return int8_dot.int_mm_gated(x, weight, act, bias, channel_scale)

    def _int_mm_weight(self, layer: nn.Module) -> QuantizedWeight | None:
        """The weight a step of many rows multiplies on ``torch._int_mm``: ``gguf_w8a8``'s prefill copy, or ``w8a8``'s
        codes; None where the layer has neither."""
        if layer.layouts.prefill_int_mm is not None:
            return layer.layouts.prefill_int_mm
        qweight = getattr(layer, "qweight", None)
        return qweight if self.per_token and qweight is not None and int8_dot.takes_int_mm(qweight) else None

    def greedy_token_ids(self, layer: nn.Module, hidden: torch.Tensor,
                         allowed: torch.Tensor | None = None) -> torch.Tensor | None:
        # Where the head's panels run on AMX tiles, at any number of rows: a one-row greedy step then sums as a verify
        # step's rows do, and skips the rows kernel's logits, which the sampler would otherwise read back. That kernel
        # takes no grammar masks (untested without AMX): the caller then masks the rows the plain argmax got wrong.
        # Elsewhere, where the step's rows run on the vector panels (see _bind).
        layouts = layer.layouts
        panels = layouts.panels
        if panels is not None and panels.amx:
            return int8_dot.amx_panel_argmax(hidden, panels) if allowed is None else None
        # The x compute_logits multiplies (apply_logits): hidden.float(), so the same route and the same float32 logits,
        # whose argmax tells apart values a bf16 model's logits would round to one.
        return None if layouts.argmax is None else layouts.argmax(hidden.float(), allowed=allowed)

    def observe_inputs(self, layer: nn.Module) -> list[torch.Tensor] | None:
        """Start recording, step by step, the largest ``|x|`` of each input channel (into the returned list, a float32
        ``[in_features]`` tensor a step) while the layer runs on its float weight (the smoothing source w8a8 keeps
        from load); None for a layer without one. The layer's fused gate/up routes step aside meanwhile (the layouts'
        ``observing``, read by :meth:`apply_gated`), so every step comes through :meth:`apply`. End it with
        :meth:`smooth`, which remakes the int8 packings."""
        layouts = layer.layouts
        source = layouts.smoothing_source
        if source is None:
            return None
        step_maxima: list[torch.Tensor] = []
        layouts.observing = True

        def observed(x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            step_maxima.append(x.detach().abs().amax(dim=0).float().cpu())
            return torch.nn.functional.linear(x, source.to(x.dtype), bias)

        layouts.linear = observed
        return step_maxima

    def smooth(self, layer: nn.Module, step_maxima: list[torch.Tensor], alpha: float) -> bool:
        """Quantize the layer again as SmoothQuant does: ``x W^T = (x / s)(W s)^T``, W s rounded to int8 per output
        channel and x / s rounded per token, ``s`` from :func:`smoothing_factors` on the mean of the steps' maxima
        (steady where the overall maximum grows with the text: its perplexity varies less with the number of chunks
        seen; benchmarks/results/report-2026-12-05-amx-xeon-w8a8-smoothing.md). Drops the float
        source. A layer that saw no input (an untied LM head: the forward does not run it) gets codes of W itself
        again; returns whether the layer was smoothed."""
        layouts = layer.layouts
        source = layouts.smoothing_source
        layouts.smoothing_source, layouts.observing = None, False
        input_max = torch.stack(step_maxima).mean(dim=0) if step_maxima else torch.zeros(source.shape[1])
        s = smoothing_factors(input_max, source, alpha)
        smoothed = not bool((s == 1).all())
        qweight = quant_kernels.quantize(source.float() * s if smoothed else source.float(), 8, None)
        inv = (1 / s).to(source.dtype) if smoothed else None
        # The GEMMs fold 1 / s into their rounding of x (quantize_per_token's channel_scale, in float32).
        layouts.gemm_channel_scale = None if inv is None else inv.float()
        if self.prefill_w8a8:  # only the prefill copy: the file's codes serve decode unsmoothed
            self._set_prefill_copy(layer, qweight, source.dtype)
        else:
            layouts.smooth_inv = inv
            self._pack(layer, qweight, source.dtype)
        self._bind(layer)
        return smoothed

    def layout_costs(self, layer: nn.Module, head: bool = False) -> LayoutCosts:
        # Estimates from the staged codes' shape and types (or the float weight's shape), before any packing: panels
        # hold a byte a code plus float32 scales (and mins) per 32; five-bit rows 20 bytes per 32 codes. A file's
        # codes keep compact scales where the int8 kernels run (_quantized, _scale_size).
        staged: dict[str | None, QuantizedCodes] = getattr(layer, "staged_codes", {})
        if not staged and self.bits is None:
            return LayoutCosts()  # gguf: a float tensor stays dense
        rows, cols = layer.weight.shape
        weights = rows * cols
        bits = self.bits or (4 if all(c.source.startswith("Q4") for c in staged.values()) else 8)
        offsets = any(c.offsets is not None for c in staged.values()) or bits == 4
        group = min((c.group_size for c in staged.values()), default=self.group_size or cols)
        int8_runs = int8_dot.takes_groups(group, cols) and int8_dot.load_int8_dot_ops() is not None
        scale_bytes = -(-cols // group) * rows * _scale_size(staged, int8_runs) * (2 if offsets else 1)
        codes = LayoutCosts(weights * bits // 8 + scale_bytes)
        if not int8_runs:
            return codes
        extras = {PANELS: weights + weights // 8 * (2 if offsets else 1)}
        if staged and all(c.source == "Q5_0" for c in staged.values()):
            extras[FIVE_BITS] = weights * 20 // 32
        model_dtype = layer.weight.dtype
        if not head and self.per_token and int8_dot.amx_runs() and cols % 64 == 0:
            extras[AMX_GEMM] = weights + rows * 4
        if not head and self.prefill_w8a8 and model_dtype == torch.bfloat16:
            extras[PREFILL_INT8] = weights + rows * 4
        if not head and not self.per_token and keeps_bf16_copy(model_dtype, layer.weight.device):
            extras[BF16_COPY] = 2 * weights
        return codes + LayoutCosts(0, extras)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        # Made anew: a draft's layers come here without create_weights.
        layer.layouts = QuantizedLayouts()
        from_float = not getattr(layer, "staged_codes", None)
        qweight = self._quantized(layer)
        if qweight is None:
            self.dense.process_weights_after_loading(layer)
            return
        model_dtype = layer.weight.dtype
        if self.per_token and from_float:  # kept until the runner smooths the layer (see observe_inputs)
            layer.layouts.smoothing_source = layer.weight.detach()
        self._hold(layer, qweight)
        if self.prefill_w8a8 and self.plan.holds(PREFILL_INT8):
            self._keep_prefill_copy(layer, qweight, model_dtype)
        if layer.layouts.amx_gemm is None and self.plan.holds(BF16_COPY):  # on AMX the int8 copy serves those steps
            self._keep_bf16_copy(layer, model_dtype)
        self._bind(layer)

    def _keep_bf16_copy(self, layer: nn.Module, model_dtype: torch.dtype) -> None:
        """Where :func:`keeps_bf16_copy` says so (not under w8a8), the layer's codes dequantized into a bf16 copy for
        prefill-sized steps."""
        qweight = layer.qweight
        if self.per_token or not keeps_bf16_copy(model_dtype, qweight.data.device):
            return
        on_amx = int8_dot.runs(qweight) and int8_dot.amx_runs()
        # The copy serves prefill-sized steps only where the AMX panels take the rest (see pack_dense).
        layer.layouts.bf16_copy = pack_dense(quant_kernels.dequantize(qweight).to(torch.bfloat16),
                                             BF16_COPY_ROWS_HINT_AMX if on_amx else 1)
        layer.layouts.bf16_copy_min_rows = bf16_copy_min_rows(qweight.shape[1], on_amx)

    def process_logits_weights_after_loading(self, layer: nn.Module) -> None:
        # A tied head is the embedding: its gathers read the same qweight, so no dense table is kept. An untied head
        # is a Linear, held the same way: no bf16 copy and no prefill copy (the logits multiply x.float() on the
        # codes, see apply_logits), nor a smoothing source (its forward never runs to calibrate it). A tied head comes
        # here without create_weights: its layouts are made here.
        layer.layouts = QuantizedLayouts()
        qweight = self._quantized(layer)
        if qweight is None:
            self.dense.process_logits_weights_after_loading(layer)
        else:
            self._hold(layer, qweight, gemm=False)  # the logits never run on the w8a8 GEMMs: no AMX packing either
            self._bind(layer)

    def _hold(self, layer: nn.Module, qweight: QuantizedWeight, gemm: bool = True) -> None:
        """Drop the checkpoint's float weight for ``qweight`` (an embedding keeps gathering in its dtype from it),
        and where the panel kernel runs keep its panels packed beside it (int8_dot.PackedPanels): steps of a few
        rows then skip repacking the whole weight per call, which dominated the LM head. Codes that fit five bits
        (Q5_0's) are kept in five bits too, for one-row decode (int8_dot.FiveBitRows): same outputs, 5/8 of the
        bytes, and one-row decode is bound by the bytes it reads."""
        model_dtype = layer.weight.dtype
        del layer.weight
        self._pack(layer, qweight, model_dtype, gemm)

    def _pack(self, layer: nn.Module, qweight: QuantizedWeight, model_dtype: torch.dtype, gemm: bool = True) -> None:
        """``qweight`` as the layer's codes, with the packings its kernels read (see :meth:`_hold`), in place of any
        it held; ``gemm`` False leaves out w8a8's AMX GEMM packing."""
        layouts = layer.layouts  # every packing set here or by _set_prefill_copy, dropped:
        layouts.panels = layouts.five_bits = layouts.amx_gemm = layouts.prefill_int_mm = None
        layer.qweight = qweight
        if int8_dot.runs(qweight):
            if self.plan.holds(PANELS):
                layouts.panels = int8_dot.pack_panels(qweight, self.per_token)
            if self.plan.holds(FIVE_BITS) and int8_dot.fits_five_bits(qweight):
                layouts.five_bits = int8_dot.pack_five_bits(qweight)
            if gemm and self.per_token and self.plan.holds(AMX_GEMM) and int8_dot.takes_amx_gemm(qweight):
                layouts.amx_gemm = self._prefill_gemm(layer, qweight, model_dtype)

    def _keep_prefill_copy(self, layer: nn.Module, qweight: QuantizedWeight, model_dtype: torch.dtype) -> None:
        """``gguf_w8a8``: give the layer its int8 prefill copy (unsmoothed until the runner calibrates it, from the
        dequantized weight it keeps as the smoothing source meanwhile) in a bf16 model where the int8 kernels run (on
        AMX tiles, for a K that is a multiple of 64)."""
        if model_dtype != torch.bfloat16 or not int8_dot.runs(qweight):
            return
        if int8_dot.amx_runs() and qweight.shape[1] % 64:
            return
        source = quant_kernels.dequantize(qweight).to(model_dtype)
        layer.layouts.smoothing_source = source
        self._set_prefill_copy(layer, quant_kernels.quantize(source.float(), 8, None), model_dtype)

    def _set_prefill_copy(self, layer: nn.Module, qweight: QuantizedWeight, model_dtype: torch.dtype) -> None:
        """``gguf_w8a8``'s int8 copy ``qweight`` (per output channel), packed for the AMX GEMM where the layer's panels
        run on tiles (the layouts' ``amx_gemm``), else as it is for ``torch._int_mm`` (``prefill_int_mm``)."""
        if int8_dot.amx_runs():
            layer.layouts.amx_gemm = self._prefill_gemm(layer, qweight, model_dtype)
        else:
            layer.layouts.prefill_int_mm = qweight

    def _prefill_gemm(self, layer: nn.Module, qweight: QuantizedWeight,
                      model_dtype: torch.dtype) -> int8_dot.AmxGemmWeight:
        # A bf16 merged gate/up layer whose activation the GEMM applies is packed for that alone (apply_gated).
        act = fused_activation_code(getattr(layer, "gated_activation", None) or "")
        return int8_dot.pack_amx_gemm(qweight, gated=act is not None and model_dtype == torch.bfloat16)

    def _gemm_min_rows(self) -> int:
        return PREFILL_W8A8_MIN_ROWS if self.prefill_w8a8 else int8_dot.AMX_GEMM_MIN_ROWS

    def _bind(self, layer: nn.Module) -> None:
        """Settle once which kernel a step of each size runs on ``layer`` (as :meth:`apply` would choose; under
        ``gguf_w8a8`` without AMX, steps from ``int8_dot.INT_MM_MIN_ROWS`` rows on the layouts' ``prefill_int_mm``;
        the bf16 copy where the layer keeps one; under ``w8a8``, steps of many rows as one int8 GEMM: on AMX tiles from
        ``int8_dot.AMX_GEMM_MIN_ROWS`` rows, ``amx_gemm_linear``, where the layer keeps ``amx_gemm``, else from
        ``int8_dot.INT_MM_MIN_ROWS``, ``int_mm_linear``), as the layouts' ``linear(x, bias)`` (and ``argmax``), or
        neither where the int8 kernels do not run. A one-row decode of Gemma 3 270M runs 73 linears a step, and
        choosing per call (attribute probes that miss, the kernels' checks) added Python time to each
        (benchmarks/results/report-2026-12-03-avx2-epyc-step-overhead.md). The weights are read from the layer and
        its layouts at each call: moving them into huge pages replaces them after load. A batch-invariant plan binds
        every step size to the panels.

        Raises:
            RuntimeError: a batch-invariant plan where the int8 kernels do not run (apply's float kernels sum rows in
                blocks that depend on the step's size).
        """
        invariant, layouts = self.plan.batch_invariant, layer.layouts
        layouts.linear = layouts.argmax = None  # (a smoothed layer's earlier route, or calibration's)
        if not int8_dot.runs(layer.qweight):
            if invariant:
                raise RuntimeError("batch_invariant runs quantized layers on jido's int8 panel kernels, which need "
                                   "AVX2 and a C++ compiler (see the build log); run without batch_invariant")
            return  # the int8 kernels do not run here: apply's other routes
        five, per_token, panel_min_rows = layouts.five_bits is not None, self.per_token, self.panel_min_rows
        panels = layouts.panels is not None
        int_mm = per_token and int8_dot.takes_int_mm(layer.qweight)
        prefill_int_mm = layouts.prefill_int_mm is not None
        plain_gemm = layouts.amx_gemm is not None and not layouts.amx_gemm.gated
        gemm_min_rows = self._gemm_min_rows()
        copy_min_rows = layouts.bf16_copy_min_rows  # set with the bf16 copy
        # Set once the layer is smoothed: the GEMMs scale x as they round it; under w8a8 the other routes get x * inv.
        inv, channel_scale = layouts.smooth_inv, layouts.gemm_channel_scale

        def route(rows: int, dtype: torch.dtype) -> int:
            """The kernel a step of ``rows`` rows in ``dtype`` runs on: one of the ``_ON_*`` codes."""
            if invariant:
                return _ON_PANELS if panels else _ON_CALL_PANELS
            bf16 = dtype == torch.bfloat16
            if prefill_int_mm and rows >= int8_dot.INT_MM_MIN_ROWS and bf16:
                return _ON_PREFILL_INT_MM
            if copy_min_rows is not None and rows >= copy_min_rows and bf16:
                return _ON_BF16_COPY
            if plain_gemm and rows >= gemm_min_rows:
                return _ON_AMX_GEMM
            if int_mm and rows >= int8_dot.INT_MM_MIN_ROWS:
                return _ON_INT_MM
            if rows >= panel_min_rows:
                return _ON_PANELS if panels else _ON_CALL_PANELS
            return _ON_FIVE_BITS if five and rows == 1 else _ON_ROWS

        def linear(x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            on = route(x.shape[0], x.dtype)
            if on == _ON_PREFILL_INT_MM:
                return int8_dot.int_mm_linear(x, layouts.prefill_int_mm, bias, channel_scale)
            if on == _ON_BF16_COPY:
                return packed_linear(x, layouts.bf16_copy, bias)
            if on == _ON_AMX_GEMM:
                return int8_dot.amx_gemm_linear(x, layouts.amx_gemm, bias, channel_scale)
            if on == _ON_INT_MM:
                return int8_dot.int_mm_linear(x, layer.qweight, bias, channel_scale)
            if inv is not None:
                x = x * inv
            if on == _ON_PANELS:
                return int8_dot.panel_linear(x, layouts.panels, bias)
            if on == _ON_CALL_PANELS:
                return int8_dot.int8_dot_linear(x, layer.qweight, bias, per_token, panels=True)
            if on == _ON_FIVE_BITS:
                return int8_dot.five_bit_linear(x, layouts.five_bits, bias, per_token)
            return int8_dot.int8_dot_linear(x, layer.qweight, bias, per_token)

        def argmax(x: torch.Tensor, bias: torch.Tensor | None = None,
                   allowed: torch.Tensor | None = None) -> torch.Tensor | None:
            """Each row's argmax of ``linear(x, bias)`` (over the columns ``allowed``, a grammar bitmask per row,
            permits) where that runs on vector panels (their kernel gives it without the outputs); else None. AMX
            panels have their own (see greedy_token_ids)."""
            if inv is not None or route(x.shape[0], x.dtype) != _ON_PANELS or layouts.panels.amx:
                return None
            return int8_dot.panel_argmax(x, layouts.panels, bias, allowed)

        layouts.linear, layouts.argmax = linear, argmax

    def _quantized(self, layer: nn.Module) -> QuantizedWeight | None:
        staged: dict[str | None, QuantizedCodes] = getattr(layer, "staged_codes", {})
        layer.staged_codes = {}
        if staged:
            qweight = _codes_of(layer, staged).pack(self.bits)
            # The file's scales stay compact (K-quants' as integers under a factor per super-block, float16 where every
            # one is a float16 value) where the int8 kernels read them; the float kernels take float32 on every call.
            if int8_dot.runs(qweight):
                return quant_kernels.compact_scales(qweight)
            return quant_kernels.with_float_scales(qweight)
        if self.bits is None:
            return None  # gguf: a tensor the file stores in float stays a dense float weight
        return quant_kernels.quantize(layer.weight.detach().float(), self.bits, self.group_size)


# GGML types whose group scales (and offsets) are the file's float16 d (and m), and the K-quants, whose are integers
# under a factor per super-block: held in 2 and about 1 byte a group where the int8 kernels read them (_quantized).
_FLOAT16_SCALED = frozenset({"Q8_0", "Q4_0", "Q5_0", "Q4_1", "Q5_1"})
_K_QUANTS = frozenset({"Q4_K", "Q5_K", "Q6_K"})


def _scale_size(staged: dict[str | None, QuantizedCodes], int8_runs: bool) -> int:
    """Bytes a group scale (or min) of these codes takes as held, for the weight plan's estimates."""
    sources = {codes.source for codes in staged.values()}
    if not int8_runs or not sources:
        return 4
    return 1 if sources <= _K_QUANTS else 2 if sources <= _FLOAT16_SCALED else 4


def smoothing_factors(input_max: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's per-input-channel factors (Xiao et al., 2023): ``s_j = max|x_j|^alpha / max|W_j|^(1 - alpha)``,
    ``max|W_j|`` over column j of ``weight`` ``[out, in]``; float32 ``[in]``. Channels never seen nonzero (or all-zero
    columns) get 1."""
    x_max = input_max.float().to(weight.device)
    w_max = weight.detach().float().abs().amax(dim=0)
    s = x_max.pow(alpha) / w_max.pow(1 - alpha)
    return torch.where((x_max > 0) & (w_max > 0) & torch.isfinite(s), s, torch.ones_like(s))


def bf16_copy_min_rows(in_features: int, on_amx: bool) -> int:
    """The fewest rows a step multiplies a layer's bf16 copy at rather than its panels: :data:`BF16_COPY_MIN_ROWS_AMX`
    on AMX tiles, else :data:`BF16_COPY_MIN_ROWS`, or past it up to :data:`PANEL_MAX_ROWS_VNNI` rows while the
    step's x rounded fits :data:`PANEL_X_MAX_BYTES_VNNI`."""
    if on_amx:
        return BF16_COPY_MIN_ROWS_AMX
    return max(BF16_COPY_MIN_ROWS, min(PANEL_MAX_ROWS_VNNI, PANEL_X_MAX_BYTES_VNNI // in_features) + 1)


def keeps_bf16_copy(model_dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a quantized layer also keeps its weight dequantized to bf16 in oneDNN's layout, for steps of
    :func:`bf16_copy_min_rows` rows or more (from 16 on vector units, 40 where its panels run on AMX tiles): in
    a bf16 model on a CPU that multiplies bf16 natively (AMX or AVX-512 BF16), where oneDNN's bf16 matmul ran
    prefill faster than the int8 panels, with AMX and on a Zen 4 EPYC without it, more so the more rows
    (benchmarks/results/report-2026-12-04-zen4-bf16-copy.md). Decode steps of fewer rows stay on the codes, which
    they stream at half the bytes. Not under w8a8, whose point is int8
    activations; not for the LM head or the tied table (logits stay float32 from the codes).

    NOTE: the copy costs 2 bytes a weight beside the codes.
    """
    info = cpu_info()
    return (device.type == "cpu" and model_dtype == torch.bfloat16 and info.has_native_bf16
            and info.has_onednn_bf16 and torch.backends.mkldnn.is_available())


def _staging_loader(layer: nn.Module, weight_loader: WeightLoader) -> WeightLoader:
    """The layer's loader, except that quantized codes are kept aside (by shard) to be packed once loaded."""

    def load(param: nn.Parameter, loaded: torch.Tensor | QuantizedCodes, shard_id: str | None = None) -> None:
        if isinstance(loaded, QuantizedCodes):
            layer.staged_codes[shard_id] = loaded
        else:
            weight_loader(param, loaded, shard_id)

    return load


def _codes_of(layer: nn.Module, staged: dict[str | None, QuantizedCodes]) -> QuantizedCodes:
    """One layer's codes: its shards in row order; a shard loaded in float is quantized to int8 to join them."""
    shard_rows: dict[str, slice] = getattr(layer, "shard_rows", {None: slice(0, layer.weight.shape[0])})
    parts = []
    for shard_id, rows in shard_rows.items():
        codes = staged.get(shard_id)
        if codes is None:
            logger.info("%s: shard %s was stored in float; quantizing it to int8 to join the others",
                        type(layer).__name__, shard_id)
            q = quant_kernels.quantize(layer.weight.detach()[rows].float(), 8, 32)
            codes = QuantizedCodes(q.data, q.scales, None, 32, "int8")
        if codes.shape != (rows.stop - rows.start, layer.weight.shape[1]):
            raise ValueError(f"{type(layer).__name__} shard {shard_id}: expected shape "
                             f"{(rows.stop - rows.start, layer.weight.shape[1])}, got {codes.shape}")
        parts.append(codes)
    return merge_codes(parts)


class GGUFConfig(QuantizationConfig):
    """Serve a GGUF file's quantized tensors as stored (the default for a .gguf model)."""

    name = "gguf"

    def __init__(self, group_size: int | None = None) -> None:
        if group_size is not None:
            raise ValueError("gguf keeps the file's own groups; quantization_group_size does not apply")

    def get_linear_method(self, layer: nn.Module) -> LinearMethod:
        return QuantizedLinearMethod(bits=None, group_size=None, plan=self.plan)


class GGUFW8A8Config(GGUFConfig):
    """``gguf``'s codes for decode, w8a8 for prefill: in a bf16 model where jido's int8 kernels run, steps of prefill
    size run each layer on an int8 copy of its dequantized weight (per output channel, smoothed at load as ``w8a8``
    is) with x rounded per token: on AMX tiles from 40 rows, elsewhere on oneDNN's int8 GEMM from 64. Everywhere else
    the same as ``gguf``."""

    name = "gguf_w8a8"

    def get_linear_method(self, layer: nn.Module) -> LinearMethod:
        return QuantizedLinearMethod(bits=None, group_size=None, prefill_w8a8=True, plan=self.plan)

    def get_logits_method(self, head: nn.Module) -> LinearMethod:
        return QuantizedLinearMethod(bits=None, group_size=None, plan=self.plan)  # the head reads only the sampled rows: gguf's route


class Int8Config(QuantizationConfig):
    """int8 weights, symmetric, per output channel (or per group of ``group_size`` inputs); float activations."""

    name = "int8"

    def __init__(self, group_size: int | None = None) -> None:
        self.group_size = _checked_group_size(group_size)

    def get_linear_method(self, layer: nn.Module) -> LinearMethod:
        return QuantizedLinearMethod(bits=8, group_size=self.group_size, plan=self.plan)


class Int4Config(QuantizationConfig):
    """int4 weights, asymmetric, in groups of ``group_size`` inputs (32 by default); float activations.

    The LM head (with the embedding, when tied) gets int8 in groups of 32 instead, as llama.cpp's Q4_K_M keeps its
    output table at 6-8 bits: in int4 the LM head alone cost Gemma 3 270M far more perplexity than int8 there did.
    """

    name = "int4"

    def __init__(self, group_size: int | None = None) -> None:
        self.group_size = _checked_group_size(group_size) or DEFAULT_INT4_GROUP_SIZE

    def get_linear_method(self, layer: nn.Module) -> LinearMethod:
        return QuantizedLinearMethod(bits=4, group_size=self.group_size, plan=self.plan)

    def get_logits_method(self, head: nn.Module) -> LinearMethod:
        return QuantizedLinearMethod(bits=8, group_size=TABLE_GROUP_SIZE, plan=self.plan)


class W8A8Config(QuantizationConfig):
    """int8 weights per output channel and int8 activations rounded per token at run time (vLLM's w8a8, dynamic):
    integer matmuls for prefill and large batches as much as for decode. The LM head (the embedding, when tied)
    too, so no float table is kept."""

    name = "w8a8"

    def __init__(self, group_size: int | None = None) -> None:
        if group_size is not None:
            raise ValueError("w8a8 scales weights per output channel; quantization_group_size does not apply")

    def get_linear_method(self, layer: nn.Module) -> LinearMethod:
        return QuantizedLinearMethod(bits=8, group_size=None, per_token=True, plan=self.plan)


def _checked_group_size(group_size: int | None) -> int | None:
    if group_size is not None and (isinstance(group_size, bool) or group_size < 2 or group_size % 2):
        raise ValueError(f"quantization_group_size must be an even integer >= 2, got {group_size!r}")
    return group_size
