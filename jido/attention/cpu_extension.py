"""Builds the C++ CPU attention kernels once per source, torch version and CPU ISA, and loads them.

The build runs at first use with ``torch.utils.cpp_extension.load`` (g++ and ninja) into
``~/.cache/jido/torch_extensions/<key>``, so a machine compiles each version once. A build that fails (no
compiler, no ninja, a compile error) logs a warning and leaves the caller on its PyTorch path.
"""
from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path

import torch

from jido.utils.cpu import cpu_info

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_decode.cpp"
CACHE_ROOT = Path.home() / ".cache" / "jido" / "torch_extensions"

# Vector flags per ISA. Zen 4 runs 512-bit vectors at full rate, but GCC prefers 256-bit unless told.
ISA_FLAGS = {
    "amx": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mprefer-vector-width=512"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mprefer-vector-width=512"],
    "avx2": ["-mavx2", "-mfma"],
    "scalar": [],
}


def build_key(source: Path, isa: str) -> str:
    """The cache folder name: the source's hash, the torch version and the ISA the code is compiled for."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    return f"jido_cpu_attn_{digest}_torch{torch.__version__.replace('+', '_').replace('.', '_')}_{isa}"


@functools.cache
def load_paged_decode(source: Path = SOURCE) -> object | None:
    """``torch.ops.jido_cpu_attn.paged_decode`` built from ``source``, or None (with a warning) if it cannot be built."""
    isa = cpu_info().isa
    key = build_key(source, isa)
    build_dir = CACHE_ROOT / key
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        from torch.utils.cpp_extension import load

        load(name=key, sources=[str(source)], build_directory=str(build_dir), is_python_module=False,
             extra_cflags=["-O3", "-fopenmp-simd", *ISA_FLAGS[isa]], verbose=False)
        return torch.ops.jido_cpu_attn.paged_decode
    except Exception as exc:  # noqa: BLE001 - any failure to build or load means: use the PyTorch path
        logger.warning("C++ attention kernels unavailable (%s: %s); using the PyTorch decode path",
                       type(exc).__name__, str(exc).strip().splitlines()[-1] if str(exc).strip() else "")
        return None
