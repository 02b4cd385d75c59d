"""What a quantized layer holds beside its codes: its other layouts, its SmoothQuant state and its bound route.

:class:`~jido.layers.quantized_linear.QuantizedLinearMethod` gives each layer it holds one :class:`QuantizedLayouts`
(``layer.layouts``) and is its only writer. The codes themselves stay ``layer.qweight``: the embedding, the tied LM
head and a draft's layers share that contract. The rest of the engine reads the fields: the weight plan's start-up
table, the bytes a decode step reads, the move into huge pages and w8a8's calibration.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from jido.layers.int8_dot import AmxGemmWeight, FiveBitRows, PackedPanels
from jido.layers.quant_kernels import QuantizedWeight


# eq=False: identity, as for the layer that holds it (field-wise == would compare tensors). slots: a misspelt field
# raises rather than setting an attribute no kernel reads.
@dataclass(eq=False, slots=True)
class QuantizedLayouts:
    """One quantized layer's layouts beside its codes, each None where the weight plan, the CPU or the scheme gives it
    none (what each serves: :mod:`jido.layers.weight_plan`); its SmoothQuant state; and the kernel route settled at
    load (``QuantizedLinearMethod._bind``).

    NOTE: moving weights into huge pages replaces ``panels`` and ``five_bits`` (and the layer's ``qweight``) after
    the route is bound; the route reads them from this object at each call, so a layer keeps this one object once
    bound.
    """

    panels: PackedPanels | None = None  # the codes prepacked for the panel kernel
    five_bits: FiveBitRows | None = None  # Q5_0's codes in five bits, for one-row steps
    # w8a8's codes packed for the AMX int8 GEMM, or gguf_w8a8's int8 prefill copy where it runs on AMX tiles
    amx_gemm: AmxGemmWeight | None = None
    prefill_int_mm: QuantizedWeight | None = None  # gguf_w8a8's int8 prefill copy for torch._int_mm (no AMX)
    bf16_copy: torch.Tensor | None = None  # the codes dequantized to bf16, in oneDNN's layout
    bf16_copy_min_rows: int | None = None  # the fewest rows a step multiplies bf16_copy at; set with it
    smoothing_source: torch.Tensor | None = None  # the float weight kept until calibration smooths the layer
    observing: bool = False  # calibration is recording inputs: every step runs on smoothing_source, through apply
    smooth_inv: torch.Tensor | None = None  # 1 / s: x is multiplied by it before the routes other than the GEMMs
    gemm_channel_scale: torch.Tensor | None = None  # 1 / s in float32, folded into the GEMMs' rounding of x
    linear: Callable[..., torch.Tensor] | None = None  # the bound route: linear(x, bias)
    # argmax(x, bias=None, allowed=None): each row's argmax of linear(x, bias) where the route gives it, else None
    argmax: Callable[..., torch.Tensor | None] | None = None


def layouts_of(module: nn.Module) -> QuantizedLayouts | None:
    """``module``'s layouts where it is a quantized layer, else None: for walks over every module of a model."""
    layouts = getattr(module, "layouts", None)
    return layouts if isinstance(layouts, QuantizedLayouts) else None
