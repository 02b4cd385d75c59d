"""Weights moved into transparent huge pages (2 MiB) on Linux, so that decode streams them at the memory's speed.

A decode step reads every weight once. In 4 KiB pages that stream needs a new TLB entry every 4 KiB, and the
CPU's hardware prefetchers stop at each 4 KiB boundary. Most kernels set transparent huge pages to ``madvise``:
memory gets them only where the process asks with ``madvise(MADV_HUGEPAGE)``, and torch's allocator never asks.
So the large weight tensors are copied, once loaded, into anonymous mappings that ask before first touch.

On a Xeon with THP ``madvise`` this sped up one-row decode of Gemma 3 270M's GGUF, the LM head most: it is the
largest single stream.
Where THP is off (``never``), missing or not Linux, nothing is moved.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import math
import mmap
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux
THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# Tensors are packed into shared mappings ("arenas") of about this size, each tensor on a cache line: the small
# ones (scales, norms) then sit in huge pages too, and the copy never holds more than one arena twice.
ARENA_BYTES = 256 << 20
ALIGN = 64
MIN_BYTES = 4096  # below a page a tensor gains nothing from moving
# Weights held outside parameters, beside a quantized layer's codes (its ``qweight``): of its layouts
# (jido/layers/quantized_layouts.py), the prepacked panels and five-bit rows. Dataclasses of tensors: each tensor
# field is moved. Not the AMX GEMM's packing (``amx_gemm``): prefill-sized steps alone read it, compute-bound, and
# w8a8's smoothing replaces it once the KV cache exists, so a copy made at load was left behind in its arena, its
# size in memory wasted.
HELD_LAYOUTS = ("panels", "five_bits")


def _thp_on() -> bool:
    return thp_mode() in ("always", "madvise")


def thp_mode(path: Path = THP_MODE_FILE) -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise`` or ``never``), or None where there is none."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


@functools.cache
def _madvise() -> ctypes._CFuncPtr | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _advised_region(nbytes: int) -> tuple[mmap.mmap, int] | None:
    """A fresh anonymous mapping with ``nbytes`` from a 2 MiB boundary (that offset returned) advised for huge
    pages, or None where madvise is missing or refuses."""
    madvise = _madvise()
    if madvise is None:
        return None
    mapped = -(-nbytes // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE  # room to start on a 2 MiB boundary
    region = mmap.mmap(-1, mapped, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    start = -base % HUGE_PAGE
    if madvise(base + start, mapped - start, MADV_HUGEPAGE) != 0:
        logger.debug("madvise(MADV_HUGEPAGE) failed (errno %d)", ctypes.get_errno())
        return None
    return region, start


def in_huge_pages(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of contiguous CPU ``tensors`` packed into one mapping advised for huge pages, each at a 64-byte
    boundary; the tensors themselves where madvise is refused or missing."""
    offsets, size = [], 0
    for t in tensors:
        offsets.append(size)
        size += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    advised = _advised_region(size) if tensors else None
    if advised is None:
        return list(tensors)
    region, start = advised
    out = []
    for t, offset in zip(tensors, offsets):
        # Each tensor holds a reference to the mapping (torch.frombuffer): it lives while any of them does.
        view = torch.frombuffer(region, dtype=torch.uint8, count=t.numel() * t.element_size(), offset=start + offset)
        out.append(view.view(t.dtype).view(t.shape).copy_(t))
    return out


def zeros_in_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero CPU tensor in memory advised for huge pages (where THP is on): the KV cache, which attention streams
    like the weights. Written once here, as ``torch.zeros`` does: left untouched, each 2 MiB page would be faulted
    in and zeroed by the step that first writes it, a cost that lands on decode steps."""
    nbytes = math.prod(shape) * dtype.itemsize
    advised = _advised_region(nbytes) if _thp_on() and nbytes >= MIN_BYTES else None
    if advised is None:
        return torch.zeros(shape, dtype=dtype)
    region, start = advised
    return torch.frombuffer(region, dtype=torch.uint8, count=nbytes, offset=start).view(dtype).view(shape).zero_()


def _movable(t: object) -> bool:
    return (isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.layout == torch.strided and not t.is_mkldnn
            and not t.is_quantized and t.is_contiguous() and t.numel() * t.element_size() >= MIN_BYTES)


def move_weights_to_huge_pages(model: nn.Module) -> int:
    """Move ``model``'s CPU weights (parameters, buffers and the quantized codes and panels held beside them) into
    huge pages, in place; returns the bytes moved (0 where THP is off or unavailable)."""
    if not _thp_on():
        return 0
    # Each distinct tensor (by address, shape and type: two views of one weight move once) and how to replace it.
    found: dict[tuple, tuple[torch.Tensor, list[Callable[[torch.Tensor], None]]]] = {}

    def add(t: torch.Tensor, setter: Callable[[torch.Tensor], None]) -> None:
        if _movable(t):
            found.setdefault((t.data_ptr(), t.dtype, tuple(t.shape)), (t, []))[1].append(setter)

    for module in model.modules():
        for param in module.parameters(recurse=False):
            add(param.data, lambda new, param=param: setattr(param, "data", new))
        for name, buf in module.named_buffers(recurse=False):
            add(buf, lambda new, module=module, name=name: module._buffers.__setitem__(name, new))
        for owner, attr in _held_weights(module):
            held = getattr(owner, attr, None)
            if dataclasses.is_dataclass(held):
                for f in dataclasses.fields(held):
                    add(getattr(held, f.name), lambda new, o=owner, a=attr, n=f.name:
                        setattr(o, a, dataclasses.replace(getattr(o, a), **{n: new})))
    arenas = _arenas(list(found.values()))
    found.clear()
    moved = 0
    # NOTE: each arena is dropped once moved, so the weights it replaced are freed as the move goes: held to the
    # end, they doubled the weights' memory at the peak (a 7B-shaped model's 15 GiB of codes and panels went past
    # a 24 GiB machine and the worker was killed).
    while arenas:
        moved += _move_arena(arenas.pop(0))
    return moved


def _held_weights(module: nn.Module) -> list[tuple[object, str]]:
    """(owner, attribute) of each dataclass of weights ``module`` may hold outside its parameters: its ``qweight``,
    and :data:`HELD_LAYOUTS` of its layouts."""
    layouts = getattr(module, "layouts", None)  # by name: jido.utils imports no layer module (tests/test_layering.py)
    return [(module, "qweight")] + ([] if layouts is None else [(layouts, attr) for attr in HELD_LAYOUTS])


def _move_arena(arena: list[tuple[torch.Tensor, list[Callable[[torch.Tensor], None]]]]) -> int:
    """Copy one arena's tensors into huge pages and point their owners at the copies; the bytes moved."""
    moved = 0
    for (old, setters), new in zip(arena, in_huge_pages([t for t, _ in arena])):
        if new is not old:
            moved += old.numel() * old.element_size()
            for setter in setters:
                setter(new)
    return moved


def _arenas(entries: list[tuple]) -> list[list[tuple]]:
    """``entries`` (each a tensor first) in consecutive groups of about :data:`ARENA_BYTES` of tensors (a larger
    tensor alone)."""
    groups: list[list[tuple]] = [[]]
    size = 0
    for entry in entries:
        nbytes = entry[0].numel() * entry[0].element_size()
        if groups[-1] and size + nbytes > ARENA_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(entry)
        size += nbytes
    return [g for g in groups if g]
