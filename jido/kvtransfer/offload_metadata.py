"""The offload connector's per-step instructions (scheduler -> workers) and reports (workers -> scheduler)."""
from __future__ import annotations

from dataclasses import dataclass, field

from jido.core.kv_connector import BlockKey


@dataclass(frozen=True)
class SaveBlock:
    """Copy a released block out before the step may overwrite it, then write it to ``tiers`` in the background."""

    block_id: int
    key: BlockKey
    tiers: tuple[str, ...]


@dataclass(frozen=True)
class MoveEntry:
    """Move an entry down the hierarchy (``dst`` None: drop it), as the scheduler's LRU for ``src`` decided."""

    key: BlockKey
    src: str
    dst: str | None


@dataclass(frozen=True)
class LoadBlock:
    block_id: int
    key: BlockKey
    tier: str


@dataclass(frozen=True)
class LoadRequest:
    """Fill a waiting request's blocks from the tiers; reported finished (or failed) as one."""

    req_id: str
    blocks: tuple[LoadBlock, ...]


@dataclass
class OffloadMetadata:
    saves: list[SaveBlock] = field(default_factory=list)
    moves: list[MoveEntry] = field(default_factory=list)
    loads: list[LoadRequest] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.saves or self.moves or self.loads)


@dataclass(frozen=True)
class StoredEvent:
    """An entry now sits in ``tier`` with this many bytes (the scheduler's budget counted an estimate)."""

    tier: str
    key: BlockKey
    num_bytes: int


@dataclass(frozen=True)
class FailedEvent:
    """A write, move or read of ``key`` in ``tier`` failed (``op``: store, load, corrupt); the entry is gone."""

    tier: str
    key: BlockKey
    op: str
    reason: str


@dataclass(frozen=True)
class LoadedEvent:
    """``key`` came back intact from ``tier`` into the cache."""

    tier: str
    key: BlockKey
    num_bytes: int
    seconds: float


@dataclass(frozen=True)
class TierDisabledEvent:
    """The tier can take no more writes (a full disk); the scheduler stops using it."""

    tier: str
    reason: str
