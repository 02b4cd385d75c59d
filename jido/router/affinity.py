"""PrefixAffinity: which instance last served each chained chunk of prompt text (SGLang's cache-aware routing).

The router never tokenizes, so it hashes the prompt's text in chunks of ``block_chars`` characters, each
hash chained to the one before (as KV blocks are): a prompt that shares a prefix with an earlier one shares
its leading hashes, and the instance that served the longest such chain most likely still has that prefix
in its KV cache.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

MAX_ENTRIES = 1 << 16  # chained hashes remembered, least recently used dropped first


def prefix_hashes(text: str, block_chars: int) -> list[bytes]:
    """Chained hashes of the text's full chunks of ``block_chars`` characters."""
    hashes, parent = [], b""
    for start in range(0, len(text) - block_chars + 1, block_chars):
        parent = hashlib.sha1(parent + text[start:start + block_chars].encode("utf-8", "surrogatepass")).digest()
        hashes.append(parent)
    return hashes


class PrefixAffinity:
    """Chained prefix hash -> the instance URL that served it last, in LRU order."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._owner: OrderedDict[bytes, str] = OrderedDict()

    def longest_match(self, hashes: list[bytes], candidates: set[str]) -> tuple[str | None, int]:
        """The candidate that served the longest leading run of ``hashes``, and that run's length in chunks."""
        best, length = None, 0
        for i, h in enumerate(hashes):
            owner = self._owner.get(h)
            if owner is None:
                break
            if owner in candidates:
                best, length = owner, i + 1
        return best, length

    def record(self, hashes: list[bytes], url: str) -> None:
        for h in hashes:
            self._owner[h] = url
            self._owner.move_to_end(h)
        while len(self._owner) > self.max_entries:
            self._owner.popitem(last=False)

    def forget(self, url: str) -> None:
        """An instance went away (its cache with it)."""
        for h in [h for h, owner in self._owner.items() if owner == url]:
            del self._owner[h]
