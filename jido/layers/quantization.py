"""The quantization seam: a config picks each linear layer's method, which owns its weights and its matmul."""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from jido.layers.parameter import WeightLoader, empty_parameter

_FEW_ROWS = 16  # up to this many rows, the LM head multiplies in the weight-major orientation


class LinearMethod(ABC):
    """How a linear layer stores ``W`` (``[out_features, in_features]``) and computes ``x W^T + b``.

    A method keeps no tensors of its own: :meth:`create_weights` registers them on the layer and the other
    methods read them back from it, so one instance may serve many layers. A quantized scheme registers
    its packed weights and scales instead of ``weight``; the layer and the model code do not change.
    """

    @abstractmethod
    def create_weights(
        self, layer: nn.Module, in_features: int, out_features: int, weight_loader: WeightLoader
    ) -> None:
        """Register the layer's weight parameters, uninitialised, on the default device and dtype.

        Every parameter registered carries ``weight_loader`` (the layer's, which knows its shards), so that
        checkpoint loading fills it.
        """

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x W^T (+ bias)``: ``[num_tokens, in_features]`` -> ``[num_tokens, out_features]``."""

    def apply_logits(self, layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head: ``[N, hidden]`` -> logits ``[N, vocab]`` in the weight's dtype, for the rows sampled.

        ``layer`` is the model's head; with tied embeddings that is the embedding, whose ``weight`` is
        ``[vocab, hidden]`` like a linear layer's. Override to pick a faster kernel for a few rows.
        """
        return self.apply(layer, hidden)


class UnquantizedLinearMethod(LinearMethod):
    """A dense ``weight`` in the model dtype."""

    def create_weights(
        self, layer: nn.Module, in_features: int, out_features: int, weight_loader: WeightLoader
    ) -> None:
        layer.weight = empty_parameter(out_features, in_features, weight_loader=weight_loader)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)

    def apply_logits(self, layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.shape[0] <= _FEW_ROWS:
            # [vocab, hidden] @ [hidden, N]: with a huge vocab and a few rows, BLAS runs this orientation
            # ~2x faster than hidden @ weight.T on CPU (measured: 36 vs 79 ms for 8 rows of Gemma 3's head).
            return torch.matmul(layer.weight, hidden.t()).t().contiguous()
        return F.linear(hidden, layer.weight)


class QuantizationConfig(ABC):
    """A checkpoint's quantization scheme: chooses the :class:`LinearMethod` of every linear layer."""

    name: str

    @abstractmethod
    def get_linear_method(self, layer: nn.Module) -> LinearMethod:
        """The method for ``layer`` (a linear layer, or the embedding that a tied LM head reuses)."""


class UnquantizedConfig(QuantizationConfig):
    """No quantization: every layer holds a dense weight in the model dtype."""

    name = "none"

    def get_linear_method(self, layer: nn.Module) -> LinearMethod:
        return UnquantizedLinearMethod()


# name -> config class; a quantization scheme registers here.
_CONFIGS: dict[str, type[QuantizationConfig]] = {UnquantizedConfig.name: UnquantizedConfig}


def get_quantization_config(name: str = UnquantizedConfig.name) -> QuantizationConfig:
    """A new config of the scheme registered as ``name``.

    Raises:
        ValueError: no scheme has that name (the message lists the known ones).
    """
    if name not in _CONFIGS:
        raise ValueError(f"unknown quantization {name!r}; available: {sorted(_CONFIGS)}")
    return _CONFIGS[name]()
