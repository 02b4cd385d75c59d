"""PrefixAffinity: which owners were sent each chained prefix hash, and which candidate holds the longest prefix.

Shared by the data-parallel engine (owners are replica indices, hashes are token blocks') and the HTTP router
(owners are instance URLs, hashes are text chunks'): each makes its own hashes and keeps its own load rule.
Pure Python, no torch.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from typing import Generic, TypeVar

Owner = TypeVar("Owner", bound=Hashable)


class PrefixAffinity(Generic[Owner]):
    """Per owner, an LRU of the chained prefix hashes it was sent: a picture of its prefix cache.

    A hash must name its whole prefix (each chained to the one before, as KV block hashes are), so an owner
    that was sent hash ``i`` of a prompt was sent hashes ``0..i`` with it, and the leading run of a prompt's
    hashes an owner holds predicts its prefix-cache hit. A prefix sent to several owners is held by each, as
    each one's cache keeps it; each owner forgets its least recently sent hashes past ``capacity``.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1 hash per owner, got {capacity}")
        self.capacity = capacity
        self._held: dict[Owner, OrderedDict[bytes, None]] = {}

    def record(self, hashes: Sequence[bytes], owner: Owner) -> None:
        """``owner`` was sent a prompt with these hashes: they become its most recent, the oldest past
        ``capacity`` are dropped."""
        held = self._held.setdefault(owner, OrderedDict())
        for h in hashes:
            held[h] = None
            held.move_to_end(h)
        while len(held) > self.capacity:
            held.popitem(last=False)

    def matched(self, hashes: Sequence[bytes], owner: Owner) -> int:
        """How many leading ``hashes`` ``owner`` holds."""
        held = self._held.get(owner, {})
        return next((i for i, h in enumerate(hashes) if h not in held), len(hashes))

    def longest_match(self, hashes: Sequence[bytes], candidates: Iterable[Owner]) -> tuple[Owner | None, int]:
        """The candidate holding the longest leading run of ``hashes`` and that run's length; among equal runs
        the first in ``candidates`` (the caller's order of preference). ``(None, 0)`` when none holds the first."""
        best, length = None, 0
        for owner in candidates:
            run = self.matched(hashes, owner)
            if run > length:
                best, length = owner, run
        return best, length

    def forget(self, owner: Owner) -> None:
        """``owner`` went away, its cache with it."""
        self._held.pop(owner, None)
