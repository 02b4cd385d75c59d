"""Tensor-parallel layers: column- and row-parallel linears, sharded QKV, and the vocab-parallel embedding.

Megatron's split: a column-parallel layer keeps a slice of the output rows (QKV by heads, gate/up by columns),
so its output is this rank's part and needs no communication; the row-parallel layer after it (o_proj,
down_proj) keeps the matching input columns and all-reduces its partial sums, once after attention and once
after the MLP. Each layer slices its rank's part out of the checkpoint tensor in its weight loaders, before
the quantization method sees it, so float weights, int8/int4 made at load and GGUF codes all shard the same
way. With a TP group of one every slice is the whole tensor and every collective a no-op.
"""
from __future__ import annotations

import torch
from torch import nn

from jido.layers.linear import Embedding, Linear, MergedLinear
from jido.layers.parameter import WeightLoader
from jido.layers.quantization import QuantizationConfig
from jido.layers.quantized_linear import QuantizedCodes
from jido.parallel.group import ParallelGroup
from jido.parallel.state import current, local_kv_heads

Loaded = torch.Tensor | QuantizedCodes


def narrow(loaded: Loaded, dim: int, start: int, length: int) -> Loaded:
    """``loaded[start:start + length]`` along ``dim`` (0: rows, 1: input columns) for tensors and GGUF codes.

    Raises:
        ValueError: the range cuts through a quantization group of the codes.
    """
    if start == 0 and length == loaded.shape[dim]:
        return loaded
    if isinstance(loaded, torch.Tensor):
        return loaded.narrow(dim, start, length)
    if dim == 0:
        rows = slice(start, start + length)
        offsets = None if loaded.offsets is None else loaded.offsets[rows]
        supers = [None if s is None else s[rows] for s in (loaded.scale_supers, loaded.offset_supers)]
        return QuantizedCodes(loaded.q[rows], loaded.scales[rows], offsets, loaded.group_size, loaded.source, *supers)
    group = loaded.group_size
    if start % group or length % group:
        raise ValueError(f"input columns [{start}, {start + length}) cut through {loaded.source}'s groups of "
                         f"{group}: this tensor-parallel size cannot split it")
    cols = slice(start // group, (start + length) // group)
    offsets = None if loaded.offsets is None else loaded.offsets[:, cols]
    # (without its super-blocks' factors: the scales stay float32, the same values)
    return QuantizedCodes(loaded.q[:, start:start + length], loaded.scales[:, cols], offsets, group, loaded.source)


def _shard_loaders(layer: nn.Module, part: dict[str | None, tuple[int, int, int]], dim: int) -> None:
    """Make each parameter's loader take ``part[shard_id]`` = (start, length, full size) along ``dim``.

    Wrapping the loaders the quantization method registered keeps it unaware of sharding: it receives this
    rank's slice as if it were the whole checkpoint tensor. A 1-D parameter (a bias) is sliced only along
    rows; a row-parallel layer's bias stays whole. The checkpoint tensor must have the unsharded shape.
    """
    for param in layer.parameters(recurse=False):
        inner: WeightLoader = param.weight_loader
        if param.dim() == 1 and dim == 1:
            continue

        def load(p: nn.Parameter, loaded: Loaded, shard_id: str | None = None, inner: WeightLoader = inner) -> None:
            if shard_id not in part:
                return inner(p, loaded, shard_id)  # the inner loader names the shards it knows
            start, length, full = part[shard_id]
            expected = (full, *p.shape[1:]) if dim == 0 else (p.shape[0], full)
            if tuple(loaded.shape) != expected:
                raise ValueError(f"expected shape {expected}, got {tuple(loaded.shape)}")
            return inner(p, narrow(loaded, dim, start, length), shard_id)

        param.weight_loader = load


def _split(total: int, tp: ParallelGroup, what: str) -> tuple[int, int, int]:
    """(start, length, total) of this rank's even share of ``total``."""
    if total % tp.world_size:
        raise ValueError(f"{what} ({total}) is not divisible by tensor_parallel_size={tp.world_size}")
    length = total // tp.world_size
    return tp.rank_in_group * length, length, total


class ColumnParallelLinear(Linear):
    """A linear layer keeping this rank's rows of ``W`` (its slice of the outputs); no communication."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 quant_config: QuantizationConfig | None = None) -> None:
        self.tp = current().tp
        part = _split(out_features, self.tp, "output features")
        super().__init__(in_features, part[1], bias, quant_config)
        _shard_loaders(self, {None: part}, dim=0)


class MergedColumnParallelLinear(MergedLinear):
    """Stacked projections (gate/up), each split by output columns: this rank keeps its slice of each."""

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool = False,
                 quant_config: QuantizationConfig | None = None) -> None:
        self.tp = current().tp
        parts = {name: _split(size, self.tp, name) for name, size in shard_sizes.items()}
        super().__init__(in_features, {name: part[1] for name, part in parts.items()}, bias, quant_config)
        _shard_loaders(self, parts, dim=0)


class QKVParallelLinear(MergedLinear):
    """Fused q/k/v split by heads: this rank's query heads and its KV heads.

    With fewer KV heads than ranks (Gemma 3's single one) each rank keeps one KV head, the one its query
    heads attend to, replicated over ``tp_size / num_kv_heads`` ranks.
    """

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False,
                 quant_config: QuantizationConfig | None = None) -> None:
        self.tp = current().tp
        tp_size, tp_rank = self.tp.world_size, self.tp.rank_in_group
        if num_heads % tp_size:
            raise ValueError(f"num_heads ({num_heads}) is not divisible by tensor_parallel_size={tp_size}")
        if num_kv_heads % tp_size and tp_size % num_kv_heads:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide or be a multiple of "
                             f"tensor_parallel_size={tp_size}")
        self.num_heads = num_heads // tp_size
        self.num_kv_heads = local_kv_heads(num_kv_heads, tp_size)
        first_kv_head = tp_rank * num_kv_heads // tp_size if num_kv_heads < tp_size else tp_rank * self.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        kv_part = (first_kv_head * head_dim, self.kv_size, num_kv_heads * head_dim)
        parts = {"q_proj": (tp_rank * self.q_size, self.q_size, num_heads * head_dim), "k_proj": kv_part,
                 "v_proj": kv_part}
        super().__init__(hidden_size, {name: part[1] for name, part in parts.items()}, bias, quant_config)
        _shard_loaders(self, parts, dim=0)


class RowParallelLinear(Linear):
    """A linear layer keeping this rank's input columns of ``W``; the partial outputs are all-reduced.

    The bias is added once, after the sum.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 quant_config: QuantizationConfig | None = None) -> None:
        self.tp = current().tp
        part = _split(in_features, self.tp, "input features")
        super().__init__(part[1], out_features, bias, quant_config)
        _shard_loaders(self, {None: part}, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.tp.all_reduce(self.linear_method.apply(self, x, None))
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(Embedding):
    """This rank's rows of the vocabulary; ids outside them embed to zeros, and the ranks' rows are summed.

    As a tied LM head it gives this rank's slice of the logits; :meth:`gather_logits` joins the slices.
    """

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        self.tp = current().tp
        self.vocab_start, self.num_rows, self.vocab_size = _split(vocab_size, self.tp, "vocab_size")
        super().__init__(self.num_rows, hidden_size)

    def weight_loader(self, param: nn.Parameter, loaded: Loaded, shard_id: str | None = None) -> None:
        if loaded.shape[0] != self.vocab_size:
            raise ValueError(f"expected shape {(self.vocab_size, *param.shape[1:])}, got {tuple(loaded.shape)}")
        super().weight_loader(param, narrow(loaded, 0, self.vocab_start, self.num_rows), shard_id)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return super().forward(input_ids)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_rows)
        out = super().forward(local.masked_fill(outside, 0))
        return self.tp.all_reduce(out.masked_fill_(outside[:, None], 0))


def gather_logits(tp: ParallelGroup, logits: torch.Tensor) -> torch.Tensor:
    """``[N, vocab / tp]`` on each rank -> ``[N, vocab]`` on every rank (so every rank samples the same)."""
    return tp.all_gather(logits, dim=-1)
