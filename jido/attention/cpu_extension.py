"""Loads the C++ CPU attention kernels (``csrc/paged_decode.cpp``: paged decode and the KV write), built and
cached by :mod:`jido.utils.cpp_build`.

A build that fails logs a warning and leaves the caller on its PyTorch decode path.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from jido.utils.cpp_build import load_ops_library

SOURCE = Path(__file__).parent / "csrc" / "paged_decode.cpp"


@functools.cache
def load_paged_decode(source: Path = SOURCE) -> object | None:
    """``torch.ops.jido_cpu_attn.paged_decode`` built from ``source``, or None (with a warning) if it cannot be built."""
    if not load_ops_library("jido_cpu_attn", source, "C++ attention kernels", "the PyTorch decode path"):
        return None
    return torch.ops.jido_cpu_attn.paged_decode


def load_write_kv() -> object | None:
    """``torch.ops.jido_cpu_attn.write_kv`` (the same library as :func:`load_paged_decode`), or None."""
    return None if load_paged_decode() is None else torch.ops.jido_cpu_attn.write_kv
