"""Maps attention backend names to their classes, importing a backend's module only when asked for."""
from __future__ import annotations

import importlib

from jido.attention.backend import AttentionBackend

# name -> (module, class)
_BACKENDS: dict[str, tuple[str, str]] = {
    "torch": ("jido.attention.torch_backend", "TorchAttentionBackend"),
    "triton": ("jido.attention.triton_backend", "TritonAttentionBackend"),
    "tiled": ("jido.attention.tiled_backend", "TiledAttentionBackend"),
}


def supported_attention_backends() -> list[str]:
    return sorted(_BACKENDS)


# The default per device type: the fastest measured there (benchmarks/results/decode_step-2026-12-01.md on
# CPU). CUDA keeps the reference until the triton kernels have been timed on a GPU.
_DEFAULT_BY_DEVICE = {"cpu": "tiled", "cuda": "torch"}


def default_attention_backend(device_type: str) -> str:
    return _DEFAULT_BY_DEVICE.get(device_type, "torch")


def get_attention_backend(name: str = "torch") -> AttentionBackend:
    """A new instance of the backend registered as ``name``.

    Raises:
        ValueError: no backend has that name (the message lists the known ones).
    """
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {supported_attention_backends()}")
    module_name, class_name = _BACKENDS[name]
    return getattr(importlib.import_module(module_name), class_name)()
