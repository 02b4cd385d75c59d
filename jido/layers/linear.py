"""Linear and embedding layers with uninitialised weights, including fused (merged) projections."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _empty_param(*shape: int) -> nn.Parameter:
    # NOTE: weights come from a checkpoint; skipping random init keeps building big models fast. The
    # parameter lands on the current default device and dtype (``with torch.device("cuda"): ...``).
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class Linear(nn.Module):
    """``y = x W^T (+ b)`` with ``W`` of shape ``[out_features, in_features]`` as in HF checkpoints."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = _empty_param(out_features, in_features)
        self.bias = _empty_param(out_features) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output dim, run as one matmul.

    ``shard_names`` are the HF names of the stacked projections (e.g. ``q_proj``, ``k_proj``, ``v_proj``);
    :meth:`load_shard` copies one of them into its rows.
    """

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool = False) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias)
        self.shard_rows: dict[str, slice] = {}
        start = 0
        for name, size in shard_sizes.items():
            self.shard_rows[name] = slice(start, start + size)
            start += size

    def load_shard(self, shard_name: str, param_name: str, tensor: torch.Tensor) -> None:
        """Copy the HF tensor ``{shard_name}.{param_name}`` (``weight`` or ``bias``) into its rows."""
        target = getattr(self, param_name)[self.shard_rows[shard_name]]
        if target.shape != tensor.shape:
            expected = tuple(target.shape)
            raise ValueError(f"{shard_name}.{param_name}: expected shape {expected}, got {tuple(tensor.shape)}")
        target.copy_(tensor)


class Embedding(nn.Module):
    """Token embedding table ``[vocab_size, hidden_size]``."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = _empty_param(vocab_size, hidden_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)
