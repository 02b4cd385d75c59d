"""Linear and embedding layers with uninitialised weights, including fused (merged) projections."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from jido.layers.parameter import copy_weight, default_weight_loader, empty_parameter
from jido.layers.quant_kernels import QuantizedWeight, compact_scales, quant_embedding
from jido.layers.quantization import QuantizationConfig, get_quantization_config
from jido.layers.quantized_linear import QuantizedCodes


class Linear(nn.Module):
    """``y = x W^T (+ b)`` with ``W`` of shape ``[out_features, in_features]`` as in HF checkpoints.

    The layer's :class:`~jido.layers.quantization.LinearMethod` (from ``quant_config``, unquantized by
    default) creates ``W`` and runs the matmul; the bias stays a dense parameter in the model dtype.
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = False, quant_config: QuantizationConfig | None = None
    ) -> None:
        super().__init__()
        self.linear_method = (quant_config or get_quantization_config()).get_linear_method(self)
        self.linear_method.create_weights(self, in_features, out_features, self.weight_loader)
        self.bias = empty_parameter(out_features, weight_loader=self.weight_loader) if bias else None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
        """The :class:`~jido.layers.parameter.WeightLoader` of this layer's parameters.

        A method of the layer, so that a tensor-parallel layer can slice its rank's part here.
        """
        default_weight_loader(param, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_method.apply(self, x, self.bias)

    def gated(self, x: torch.Tensor) -> torch.Tensor | None:
        """``act(gate) * up`` of this merged gate/up layer's output (``gated_activation``, set by the model that
        builds it), fused into the product where the method can
        (:meth:`~jido.layers.quantization.LinearMethod.apply_gated`), else None."""
        return self.linear_method.apply_gated(self, x, self.gated_activation, self.bias)


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output dim, run as one matmul.

    ``shard_sizes`` maps the HF names of the stacked projections (e.g. ``q_proj``, ``k_proj``, ``v_proj``)
    to their output sizes; :meth:`weight_loader` copies the one named by ``shard_id`` into its rows.
    """

    def __init__(
        self,
        in_features: int,
        shard_sizes: dict[str, int],
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
    ) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias, quant_config)
        self.shard_rows: dict[str, slice] = {}
        start = 0
        for name, size in shard_sizes.items():
            self.shard_rows[name] = slice(start, start + size)
            start += size

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
        """Copy the HF tensor of projection ``shard_id`` (weight or bias) into its rows of ``param``."""
        if shard_id not in self.shard_rows:
            raise ValueError(f"merged projection needs a shard id, one of {list(self.shard_rows)}; got {shard_id!r}")
        copy_weight(param.data[self.shard_rows[shard_id]], loaded)


class Embedding(nn.Module):
    """Token embedding table ``[vocab_size, hidden_size]``; a tied LM head multiplies by the same table.

    A table that arrives quantized (GGUF codes) is kept as ``qweight`` and gathered row by row, with no
    dense copy; so is one the tied head's quantized method quantized (see :mod:`jido.layers.quantized_linear`).
    """

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = empty_parameter(vocab_size, hidden_size, weight_loader=self.weight_loader)
        self.staged_codes: dict[str | None, QuantizedCodes] = {}
        self.qweight: QuantizedWeight | None = None
        self.compute_dtype = self.weight.dtype

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor | QuantizedCodes,
                      shard_id: str | None = None) -> None:
        """Copy a float table; keep quantized codes aside for :meth:`process_weights_after_loading`."""
        if isinstance(loaded, QuantizedCodes):
            self.staged_codes[None] = loaded
        else:
            default_weight_loader(param, loaded)

    def process_weights_after_loading(self) -> None:
        """Pack codes still staged (an untied table; a tied head's method has packed them already)."""
        codes = self.staged_codes.pop(None, None)
        if codes is not None:
            self.qweight = compact_scales(codes.pack())  # a gather widens its rows' scales (quant_embedding)
            del self.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.qweight is not None:
            return quant_embedding(input_ids, self.qweight, self.compute_dtype)
        return F.embedding(input_ids, self.weight)
