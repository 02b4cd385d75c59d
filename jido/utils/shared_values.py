"""Values built once per key and shared by everything in the process that holds them, dropped with the last holder.

A process that starts several engines of one model (tests, notebooks, ablations, data-parallel replicas in one
process) would otherwise parse the same tokenizer files once per engine, each parse seconds and hundreds of MiB for
a large vocabulary (benchmarks/results/engine_start-*.md). Only immutable values belong here: every holder sees the
same object.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Generic, TypeVar

V = TypeVar("V")


class Shared(Generic[V]):
    """One shared value; the cache keeps it while some object holds this wrapper (``value`` need not be
    weak-referenceable: Rust-backed objects often are not)."""

    __slots__ = ("value", "__weakref__")

    def __init__(self, value: V) -> None:
        self.value = value


class SharedValues(Generic[V]):
    """Values by key, each built by its first caller and held only as long as some caller holds its ``Shared``."""

    def __init__(self) -> None:
        self._held: weakref.WeakValueDictionary[Hashable, Shared[V]] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], V]) -> Shared[V]:
        """The value for ``key``, made by ``make()`` if no holder has it now (under a lock: made once)."""
        with self._lock:
            held = self._held.get(key)
            if held is None:
                held = self._held[key] = Shared(make())
            return held

    def keys(self) -> list[Hashable]:
        """The keys whose values some holder holds now."""
        return list(self._held.keys())


def file_identity(path: Path) -> tuple[str, int, int]:
    """A key that changes when the file is rewritten: its resolved path, modification time and size."""
    stat = path.stat()
    return str(path.resolve()), stat.st_mtime_ns, stat.st_size
