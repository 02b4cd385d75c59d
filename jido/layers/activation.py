"""Gated MLP activations, ``act(gate) * up``, looked up by their HF ``hidden_act`` name.

On CPU, float32 and bf16 SiLU and tanh-GELU run as one C++ pass (``csrc/activation.cpp``): ATen's two ops over a
strided half of the input, with its GELU's tanh, were a visible part of a prefill's time on the AVX2 EPYC and in
bf16 on a Zen 4. The kernel's exp is within 2 ulp, so its values can differ from ATen's in the last bits (in bf16,
now and then by one unit where the activation lies near a rounding boundary). On CUDA, in any dtype, one Triton
kernel (``triton_ops.act_and_mul``) where ATen launches two, where it pays (``triton_ops_for``).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from jido.layers.rms_norm import triton_ops_for
from jido.utils.cpp_build import load_ops_library

SOURCE = Path(__file__).parent / "csrc" / "activation.cpp"

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "gelu_new": partial(F.gelu, approximate="tanh"),
}
# The C++ kernel's `act` argument for the activations it fuses.
_FUSED = {"silu": 0, "gelu_pytorch_tanh": 1, "gelu_new": 1}


@functools.cache
def load_activation_ops(source: Path = SOURCE) -> object | None:
    """``torch.ops.jido_act`` (``act_and_mul``) built from ``source``, or None (with a warning)."""
    if not load_ops_library("jido_act", source, "C++ gated activation kernel", "ATen's activation and product"):
        return None
    return torch.ops.jido_act


def fused_activation_code(name: str) -> int | None:
    """The C++ kernels' number for activation ``name`` (``act_and_mul``'s, and the AMX int8 GEMM's fused gate/up
    epilogue's), or None where they do not apply it."""
    return _FUSED.get(name)


def get_gated_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Return ``f(gate_up) -> act(gate) * up`` for a fused ``[num_tokens, 2 * intermediate]`` input.

    Raises:
        ValueError: ``name`` is not a supported activation.
    """
    if name not in _ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {name!r}; supported: {sorted(_ACTIVATIONS)}")
    act, fused = _ACTIVATIONS[name], _FUSED.get(name)

    def gated(gate_up: torch.Tensor) -> torch.Tensor:
        # The fused kernels have no backward: a draft being trained takes the ATen ops, which autograd follows.
        if fused is not None and gate_up.dim() == 2 and gate_up.is_contiguous() and not gate_up.requires_grad:
            on_cpu = gate_up.is_cpu and gate_up.dtype in (torch.float32, torch.bfloat16)
            ops = load_activation_ops() if on_cpu else triton_ops_for(gate_up)
            if ops is not None:
                return ops.act_and_mul(gate_up, fused)
        gate, up = gate_up.chunk(2, dim=-1)
        return act(gate) * up

    return gated
