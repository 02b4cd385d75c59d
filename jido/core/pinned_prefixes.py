"""PinnedPrefixes: prompt prefixes whose cached blocks are held in the device pool until unpinned (CAG)."""
from __future__ import annotations

from dataclasses import dataclass

from jido.core.kv_cache_manager import KVCacheManager
from jido.core.request import Request
from jido.core.sampling_params import SamplingParams
from jido.metrics.stats import PinnedPrefixStats

class PinTooLargeError(ValueError):
    """A prefix to pin would leave too little of the pool for a full-length request; nothing was pinned or evicted."""


class TooManyPinsError(ValueError):
    """As many prefixes as ``max_pinned_prefixes`` are pinned (or prefilling to be); nothing was pinned."""


@dataclass
class _Pin:
    holder: Request  # never scheduled: it only holds the blocks
    token_ids: tuple[int, ...]
    hits: int = 0


class PinnedPrefixes:
    """Holds a reference on the cached blocks of each pinned prefix, so the pool never evicts them.

    A pin holds exactly what a later prompt that starts with the prefix reuses: in full groups every block
    of the prefix, in sliding-window groups the blocks the query just after it sees. Pinning takes blocks
    that are cached and free (or already shared), never blocks of running requests.
    """

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self._pins: dict[str, _Pin] = {}

    def __contains__(self, pin_id: str) -> bool:
        return pin_id in self._pins

    def __len__(self) -> int:
        return len(self._pins)

    @property
    def num_blocks(self) -> int:
        return sum(self._blocks(pin) for pin in self._pins.values())

    def room(self, request_peak_blocks: int) -> int:
        """Pool blocks another pin may take so that a request holding ``request_peak_blocks`` still fits."""
        return self.kv.pool.num_blocks - request_peak_blocks - self.num_blocks

    def pin(self, pin_id: str, token_ids: list[int]) -> int:
        """Hold the cached blocks of ``token_ids`` (prefilled just before); returns the tokens they cover."""
        if pin_id in self._pins:
            raise ValueError(f"pinned prefix {pin_id!r} exists already")
        # One token past the prefix, so that the hit may cover its last whole block.
        holder = Request(f"pin:{pin_id}", [*token_ids, 0], SamplingParams(max_tokens=1))
        hits, num_tokens = self.kv.get_computed_blocks(holder)
        self.kv.allocate_slots(holder, 0, hits)  # takes no new block: only references the hits
        self._pins[pin_id] = _Pin(holder, tuple(token_ids[:num_tokens]))
        return num_tokens

    def unpin(self, pin_id: str) -> None:
        """Release a pin's blocks to the cache (they stay cached until evicted). Raises KeyError if unknown."""
        pin = self._pins.pop(pin_id)
        self.kv.free(pin.holder)

    def count_hit(self, request: Request, num_hit_tokens: int) -> None:
        """Count, for each pin, a newly admitted request whose cached prefix covers it."""
        for pin in self._pins.values():
            size = len(pin.token_ids)
            if size and num_hit_tokens >= size and tuple(request.prompt_token_ids[:size]) == pin.token_ids:
                pin.hits += 1

    def stats(self) -> tuple[PinnedPrefixStats, ...]:
        return tuple(PinnedPrefixStats(pin_id, len(p.token_ids), self._blocks(p), p.hits)
                     for pin_id, p in self._pins.items())

    def _blocks(self, pin: _Pin) -> int:
        return sum(1 for table in self.kv.req_to_blocks[pin.holder.request_id] for b in table if b is not None)
