"""PushBuffer: a consumer's room for KV that producers pushed before any request of its own claimed it."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from jido.kvtransfer.handoff import Handoff, HandoffState, KVFormat


@dataclass
class Pushed:
    """One hand-off's pushed pieces: ``(group, position)`` -> ``[(layer ids, payload)]``, in arrival order."""

    format: KVFormat
    codec: str
    handoff: Handoff
    reserved_bytes: int
    pieces: dict[tuple[int, int], list[tuple[tuple[int, ...], memoryview]]] = field(default_factory=dict)
    num_bytes: int = 0
    final: bool = False
    started: float = field(default_factory=time.monotonic)


class PushBuffer:
    """Pushed KV waiting for its request, within ``capacity`` bytes, each hand-off for at most ``lease_s``.

    A producer's first message reserves room for the whole prompt (the raw size: codecs only shrink it);
    when there is none the push is refused and the producer keeps the KV for a pull. Entries nobody claims
    within the lease are dropped. Thread-safe: the endpoint's thread puts, the loader claims.
    """

    def __init__(self, capacity: int, lease_s: float) -> None:
        self.capacity = capacity
        self.lease_s = lease_s
        self.used = 0
        self._entries: OrderedDict[str, Pushed] = OrderedDict()
        self._finished: OrderedDict[str, None] = OrderedDict()  # claimed or dropped: later pushes are refused
        self._lock = threading.Condition()

    def put(self, handle_id: str, header: dict[str, Any], payloads: list[memoryview]) -> str | None:
        """Store one push message; returns None, or why it was refused."""
        with self._lock:
            if handle_id in self._finished:
                return "this hand-off is already over here (loaded, or dropped after its lease)"
            entry = self._entries.get(handle_id)
            if entry is None:
                entry = self._reserve(handle_id, header)
                if entry is None:
                    return f"no room to buffer pushed KV ({self.used} of {self.capacity} bytes in use)"
            for (group, position, layers), payload in zip(header["pieces"], payloads):
                entry.pieces.setdefault((group, position), []).append((tuple(layers), payload))
                entry.num_bytes += len(payload)
            entry.final = entry.final or bool(header.get("final"))
            self._lock.notify_all()
            return None

    def _reserve(self, handle_id: str, header: dict[str, Any]) -> Pushed | None:
        fmt = KVFormat.from_dict(header["format"])
        reserve = int(header["reserve_bytes"])
        if self.used + reserve > self.capacity:
            return None
        self.used += reserve
        handoff = Handoff(handle_id, HandoffState.RESERVED, time.monotonic() + self.lease_s)
        handoff.advance(HandoffState.IN_TRANSFER)
        entry = Pushed(fmt, str(header["codec"]), handoff, reserve)
        self._entries[handle_id] = entry
        return entry

    def has(self, handle_id: str) -> bool:
        with self._lock:
            return handle_id in self._entries

    def take(self, handle_id: str, timeout_s: float, grace_s: float = 0.0) -> Pushed | None:
        """The hand-off's entry once its last piece came (removed from the buffer), or None: none came in
        time, or nothing was pushed here within ``grace_s`` (the producer's first message may still be on
        its way)."""
        now = time.monotonic()
        deadline, first_by = now + timeout_s, now + grace_s
        with self._lock:
            while True:
                entry = self._entries.get(handle_id)
                if entry is not None and entry.final or entry is None and time.monotonic() >= first_by:
                    break
                left = (deadline if entry is not None else first_by) - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            self._finish(handle_id)
            return entry if entry is not None and entry.final else None

    def _finish(self, handle_id: str) -> None:
        entry = self._entries.pop(handle_id, None)
        if entry is not None:
            self.used -= entry.reserved_bytes
        self._finished[handle_id] = None
        while len(self._finished) > 4096:
            self._finished.popitem(last=False)

    def expire(self) -> list[str]:
        """Drop the entries whose lease ran out; returns their handle ids."""
        now = time.monotonic()
        with self._lock:
            gone = [h for h, e in self._entries.items() if e.handoff.expired(now)]
            for handle_id in gone:
                self._entries[handle_id].handoff.advance(HandoffState.EXPIRED)
                self._finish(handle_id)
            return gone
