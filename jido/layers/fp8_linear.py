"""FP8 (e4m3) linear layers for GPUs with FP8 tensor cores: weights per output channel, activations per token.

A float checkpoint loads as usual; once loaded each linear layer's weight becomes float8_e4m3fn codes with one
float32 scale per output row (``w ~ q * scale``, scale = the row's absolute maximum / 448, e4m3's largest
finite value). At run time each row of x gets its own scale the same way, and ``torch._scaled_mm`` multiplies
the codes on the tensor cores and applies both scales in its epilogue (cuBLASLt's row-wise scaling, Hopper and
Ada). This is vLLM's dynamic ``fp8`` for an unquantized checkpoint, with per-channel rather than per-tensor
weight scales (one outlier row no longer coarsens every other row's steps).

The LM head multiplies in fp8 too (vLLM's fp8 keeps it in the model's dtype): on a small model it holds most of
the weights (Gemma 3 270M's 262,144 x 640 table is 62%), and decode reads it every step. A tied head is the
embedding, whose gathers need the float table: its e4m3 copy sits beside it, as the dense method keeps a packed
one beside it on CPU.

``torch._scaled_mm`` also runs on CPU tensors in torch 2.13, as a reference implementation: a loop orders of
magnitude slower than float32's F.linear. The engine therefore refuses
fp8 on a CPU (see :func:`jido.runner.model_loading.resolve_quantization`); tests run the method there on small
shapes.
"""
from __future__ import annotations

import torch
from torch import nn

from jido.layers.parameter import WeightLoader
from jido.layers.quantization import LinearMethod, QuantizationConfig, UnquantizedLinearMethod, is_untied_head

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448
# cuBLASLt's FP8 matmul wants both matrix dimensions of the weight divisible by 16.
_ALIGNMENT = 16
# The GPU generation with FP8 tensor cores: Ada (8.9) and Hopper (9.0) on.
MIN_CAPABILITY = (8, 9)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[rows, cols]`` as e4m3 codes and a float32 scale per row ``[rows, 1]``: ``x ~ codes * scale``.

    A row of zeros gets a tiny scale instead of zero, so its codes (zeros) stay finite. On a GPU one Triton
    kernel does it (:mod:`jido.layers.fp8_kernels`: :func:`quantize_rows_reference`'s values up to the last bit of a
    division, see there).
    """
    if x.is_cuda and x.stride(-1) == 1:
        from jido.layers.fp8_kernels import quantize_rows_cuda  # triton compiles only for GPUs

        return quantize_rows_cuda(x, FP8_DTYPE)
    return quantize_rows_reference(x)


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_rows` in PyTorch ops."""
    amax = x.abs().amax(dim=1, keepdim=True).float()
    scale = (amax / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    codes = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return codes, scale


def fp8_linear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x W^T (+ bias)`` for W held as ``codes`` ``[out, in]`` and its per-row ``scale`` ``[1, out]``.

    The output is bf16 (row-wise scaling in cuBLASLt writes bf16 only), then cast to x's dtype.
    """
    x_codes, x_scale = quantize_rows(x)
    out = torch._scaled_mm(x_codes, codes.t(), scale_a=x_scale, scale_b=scale, out_dtype=torch.bfloat16)
    out = out.to(x.dtype)
    return out if bias is None else out + bias


class Fp8LinearMethod(LinearMethod):
    """A dense weight while loading, e4m3 codes and per-row scales once loaded (``weight``, ``weight_scale``; a
    tied head's ``logits_codes``, ``logits_scale``).

    A layer whose shape cuBLASLt's FP8 matmul cannot take (a dimension not divisible by 16) stays dense.
    """

    def __init__(self) -> None:
        self.dense = UnquantizedLinearMethod()

    def create_weights(
        self, layer: nn.Module, in_features: int, out_features: int, weight_loader: WeightLoader
    ) -> None:
        self.dense.create_weights(layer, in_features, out_features, weight_loader)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        scale = getattr(layer, "weight_scale", None)
        if scale is None:
            return self.dense.apply(layer, x, bias)
        return fp8_linear(x, layer.weight, scale, bias)

    def apply_logits(self, layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        codes = getattr(layer, "logits_codes", None)
        if codes is not None:  # a tied head: the e4m3 copy beside the embedding's table
            return fp8_linear(hidden, codes, layer.logits_scale, None).float()
        return self.apply(layer, hidden).float()

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        quantized = _quantized(layer.weight)
        if quantized is not None:
            codes, layer.weight_scale = quantized
            layer.weight = nn.Parameter(codes, requires_grad=False)

    def process_logits_weights_after_loading(self, layer: nn.Module) -> None:
        if is_untied_head(layer):  # its own codes in place of the weight, as any linear layer's
            self.process_weights_after_loading(layer)
            return
        quantized = _quantized(layer.weight)
        if quantized is not None:
            layer.logits_codes, layer.logits_scale = quantized


def _quantized(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(codes ``[out, in]``, scales ``[1, out]``: the row-wise scale of _scaled_mm's second operand), or None for a
    shape cuBLASLt's FP8 matmul does not take."""
    out_features, in_features = weight.shape
    if out_features % _ALIGNMENT or in_features % _ALIGNMENT:
        return None
    codes, scale = quantize_rows(weight.detach())
    return codes, scale.reshape(1, -1)


class Fp8Config(QuantizationConfig):
    """FP8 e4m3 weights and activations, scaled per output channel and per token, for GPUs with FP8 tensor cores."""

    name = "fp8"

    def __init__(self, group_size: int | None = None) -> None:
        if group_size is not None:
            raise ValueError("fp8 scales weights per output channel; quantization_group_size does not apply")

    def get_linear_method(self, layer: nn.Module) -> LinearMethod:
        return Fp8LinearMethod()

