"""The C library's allocator told to keep large freed blocks for the next step instead of handing them back.

glibc serves a block of 32 MiB or more with its own ``mmap`` and unmaps it on ``free``, whatever its dynamic
threshold has learned (that threshold stops at 32 MiB). torch's CPU allocator caches nothing, so a tensor of that
size made every step, such as a 32-row decode step's logits over Gemma 3's 262,144-token vocabulary (exactly
32 MiB in float32), comes back as fresh pages each time: 8,192 page faults, and the kernel zeroes every page,
which costs far more than filling a reused tensor (benchmarks/results/report-2026-12-06-zen4-lm-head.md).

vLLM's CPU images get the same from tcmalloc in ``LD_PRELOAD``; here the policy is set with ``mallopt`` once the
model and its KV cache are loaded, so that the load's own temporaries are still given back. The cost is memory the
process keeps: torch asks for 64-byte aligned blocks, which do not fit the hole an equal block left, so the heap
grows by a few blocks before holes merge and it settles (a 40 MiB block made over and over: five or six more).
The policy is the process's while an engine in it serves: an engine that shuts down trims the heap, and the last one
puts glibc's thresholds back, so a process that outlives its engines (a notebook, a test session) does not keep their
memory.
"""
from __future__ import annotations

import ctypes
import functools
import logging

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # <malloc.h>: free memory kept at the top of the heap before it is given back
M_MMAP_THRESHOLD = -3  # <malloc.h>: blocks of at least this size get their own mapping
# Blocks up to this size come from the heap and stay there once freed: a decode step of 256 rows over a
# 262,144-token vocabulary makes 256 MiB of float32 logits.
KEEP_BYTES = 256 << 20
GLIBC_DEFAULT_BYTES = 128 << 10  # both thresholds' defaults (DEFAULT_MMAP_THRESHOLD_MIN, DEFAULT_TRIM_THRESHOLD)
_holders = 0  # engines in this process that asked to keep freed blocks and have not shut down


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def give_back_free_memory() -> bool:
    """Hand the heap's free pages back to the kernel (``malloc_trim(0)``), wherever they lie in the heap.

    A load frees most of what it made (decoded tensors, staging copies, packings remade), but glibc only returns
    free memory at the top of its heap; the rest stayed resident for the life of the process (on the default model,
    about a third of the worker's memory). Returns whether the C library has the call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _mallopt() -> ctypes._CFuncPtr | None:
    # The process's own symbols, as huge_pages reaches madvise: find_library would run ldconfig in a subprocess.
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt), or not Linux
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def keep_freed_blocks(limit: int = KEEP_BYTES) -> bool:
    """Keep freed blocks up to ``limit`` bytes in this process's heap for reuse (both thresholds to ``limit``) until
    every caller has called :func:`release_freed_blocks`. Returns whether the C library took the setting (False where
    it has no ``mallopt``)."""
    global _holders
    if not _set_thresholds(limit):
        return False
    _holders += 1
    logger.info("allocator keeps freed blocks of up to %d MiB for reuse (mallopt)", limit >> 20)
    return True


def release_freed_blocks() -> None:
    """One caller of :func:`keep_freed_blocks` is done (its blocks freed): the heap's free pages go back to the
    kernel, and after the last caller glibc's default thresholds come back."""
    global _holders
    if _holders == 0:
        return
    _holders -= 1
    if _holders == 0:
        _set_thresholds(GLIBC_DEFAULT_BYTES)
    give_back_free_memory()  # an engine's freed blocks are holes in the heap the others share: trimmed, not kept


def _set_thresholds(limit: int) -> bool:
    mallopt = _mallopt()
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, limit)) and bool(mallopt(M_TRIM_THRESHOLD, limit))
