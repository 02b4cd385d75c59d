"""RMSNorm in the two flavours our model families use: ``w * x`` (Llama) and ``(1 + w) * x`` (Gemma)."""
from __future__ import annotations

import torch
from torch import nn

from jido.layers.parameter import empty_parameter


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, computed in float32.

    ``unit_offset=True`` gives Gemma's ``x * (1 + w)``, multiplied in float32 *before* casting back, as HF
    does; otherwise Llama's ``w * x`` where the normalised ``x`` is cast back before the multiply. The two
    orders only differ in half precision, but matching them keeps our logits equal to transformers'.
    """

    def __init__(self, dim: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = empty_parameter(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (normed * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * normed.to(x.dtype)
