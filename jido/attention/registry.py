"""Maps attention backend names to their classes, importing a backend's module only when asked for."""
from __future__ import annotations

import importlib
import importlib.util

from jido.attention.backend import AttentionBackend

# name -> (module, class)
_BACKENDS: dict[str, tuple[str, str]] = {
    "torch": ("jido.attention.torch_backend", "TorchAttentionBackend"),
    "triton": ("jido.attention.triton_backend", "TritonAttentionBackend"),
    "tiled": ("jido.attention.tiled_backend", "TiledAttentionBackend"),
}


def supported_attention_backends() -> list[str]:
    return sorted(_BACKENDS)


# The default per device type: the fastest measured there.
# CPU: benchmarks/results/archive/decode_step-2026-12-01-zen4.md.
# CUDA: benchmarks/results/gpu_session-2026-12-04-h200.md, where triton beat torch on every workload of both model
# shapes (its decode replays from CUDA graphs, which the torch backend does not support), if triton is installed
# (it comes with PyTorch's CUDA wheels).
_DEFAULT_BY_DEVICE = {"cpu": "tiled", "cuda": "triton"}


def default_attention_backend(device_type: str) -> str:
    name = _DEFAULT_BY_DEVICE.get(device_type, "torch")
    if name == "triton" and importlib.util.find_spec("triton") is None:
        return "torch"
    return name


def get_attention_backend(name: str = "torch", batch_invariant: bool = False) -> AttentionBackend:
    """A new instance of the backend registered as ``name``; with ``batch_invariant``, one whose result for a query
    row is the same bits whatever the step it is in (see ``AttentionBackend.supports_batch_invariance``).

    Raises:
        ValueError: no backend has that name (the message lists the known ones), or it has no batch-invariant route.
    """
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {supported_attention_backends()}")
    module_name, class_name = _BACKENDS[name]
    backend_cls = getattr(importlib.import_module(module_name), class_name)
    if not batch_invariant:
        return backend_cls()
    if not backend_cls.supports_batch_invariance:
        raise ValueError(f"attention backend {name!r} has no batch-invariant route; use tiled")
    return backend_cls(batch_invariant=True)
