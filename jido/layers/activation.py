"""Gated MLP activations, ``act(gate) * up``, looked up by their HF ``hidden_act`` name."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "gelu_new": partial(F.gelu, approximate="tanh"),
}


def get_gated_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Return ``f(gate_up) -> act(gate) * up`` for a fused ``[num_tokens, 2 * intermediate]`` input.

    Raises:
        ValueError: ``name`` is not a supported activation.
    """
    if name not in _ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {name!r}; supported: {sorted(_ACTIVATIONS)}")
    act = _ACTIVATIONS[name]

    def gated(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return act(gate) * up

    return gated
