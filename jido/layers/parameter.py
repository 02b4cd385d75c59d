"""Checkpoint-filled parameters: where they are created (default device and dtype) and how they are loaded."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
from torch import nn


class WeightLoader(Protocol):
    """Copies one checkpoint tensor into a parameter; every parameter carries one as ``param.weight_loader``.

    Args:
        param: the parameter to fill (its ``.data`` is written in place).
        loaded: the checkpoint tensor, in any dtype and on any device; it is cast to ``param``'s.
        shard_id: which part of a merged parameter ``loaded`` is (e.g. ``"k_proj"``); ``None`` for a whole one.

    Raises:
        ValueError: ``loaded`` does not have the shape of its destination; the message names both shapes.
    """

    def __call__(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None: ...


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
    """The :class:`WeightLoader` of an unsharded parameter: a shape-checked copy."""
    copy_weight(param.data, loaded)


def copy_weight(target: torch.Tensor, loaded: torch.Tensor) -> None:
    """Copy ``loaded`` into ``target`` (a parameter or a slice of one), casting to its dtype and device."""
    if target.shape != loaded.shape:
        raise ValueError(f"expected shape {tuple(target.shape)}, got {tuple(loaded.shape)}")
    target.copy_(loaded)


def empty_parameter(*shape: int, weight_loader: WeightLoader = default_weight_loader) -> nn.Parameter:
    """An uninitialised parameter on the current default device and dtype, filled later by ``weight_loader``."""
    # NOTE: weights come from a checkpoint; skipping random init keeps building big models fast.
    param = nn.Parameter(torch.empty(*shape), requires_grad=False)
    param.weight_loader = weight_loader
    return param


@contextmanager
def default_device_and_dtype(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Create tensors on ``device`` in ``dtype`` inside the block; restores the previous defaults after it.

    Building a model inside it puts every parameter straight on its device in its final dtype, so no
    float32 copy on the CPU is ever made. NOTE: the default dtype is process-wide; hold this only while
    constructing a model. Buffers that need float32 ask for it explicitly.
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)
