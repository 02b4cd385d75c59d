"""Byte stores for KV entries, one per offload tier: CPU memory, a folder on disk, and Redis.

A store only holds bytes under keys; which entries it keeps (its LRU and budget) is decided by the offload
connector's scheduler side, and what the bytes mean by the entry format and codecs. Every method may raise
(``OSError`` from a disk, ``StoreError`` from Redis); the caller turns that into recompute and a warning.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

from jido.config.kv_offload import TierConfig
from jido.core.kv_connector import BlockKey


class StoreError(RuntimeError):
    """A remote store refused or did not answer in time (down, slow, or out of memory)."""


def key_name(key: BlockKey) -> str:
    group, block_hash = key
    return f"{group}-{block_hash.hex()}"


def parse_key_name(name: str) -> BlockKey | None:
    """The key :func:`key_name` made ``name`` from, or None for a name it cannot have made."""
    group, _, digits = name.partition("-")
    try:
        return int(group), bytes.fromhex(digits)
    except ValueError:
        return None


class ByteStore(ABC):
    """Entries by block key, for one fingerprint (model, dtype, KV layout and block size)."""

    name: str

    @abstractmethod
    def put(self, key: BlockKey, data: bytes) -> None: ...

    @abstractmethod
    def get(self, key: BlockKey) -> bytes | None:
        """The entry's bytes, or None when it is not there (never stored, or evicted)."""

    @abstractmethod
    def delete(self, key: BlockKey) -> None: ...

    def contains(self, keys: Sequence[BlockKey]) -> list[bool]:
        """For each key, whether an entry is there (remote stores answer in one round trip)."""
        raise NotImplementedError(f"the {self.name} tier is indexed by the scheduler, not asked")

    def close(self) -> None:
        """Release connections or files."""


class CpuStore(ByteStore):
    """Entries in this process's memory."""

    name = "cpu"

    def __init__(self, tier: TierConfig, fingerprint: str) -> None:
        self._entries: dict[BlockKey, bytes] = {}
        self._lock = threading.Lock()

    def put(self, key: BlockKey, data: bytes) -> None:
        with self._lock:
            self._entries[key] = data

    def get(self, key: BlockKey) -> bytes | None:
        with self._lock:
            return self._entries.get(key)

    def delete(self, key: BlockKey) -> None:
        with self._lock:
            self._entries.pop(key, None)


class DiskStore(ByteStore):
    """One file per entry under ``path/<fingerprint>/``; written aside and renamed, so a reader never sees half.

    Entries outlive the process: a later run of the same fingerprint indexes them (:func:`disk_entries`).
    """

    name = "disk"

    def __init__(self, tier: TierConfig, fingerprint: str) -> None:
        self.folder = disk_folder(tier, fingerprint)
        self.folder.mkdir(parents=True, exist_ok=True)
        for partial in self.folder.glob("*.partial"):  # a write an earlier run did not finish
            partial.unlink(missing_ok=True)

    def _path(self, key: BlockKey) -> Path:
        return self.folder / key_name(key)

    def put(self, key: BlockKey, data: bytes) -> None:
        path = self._path(key)
        partial = path.with_suffix(".partial")
        try:
            write_file(partial, data)
            os.replace(partial, path)
        except OSError:
            partial.unlink(missing_ok=True)
            raise

    def get(self, key: BlockKey) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def delete(self, key: BlockKey) -> None:
        self._path(key).unlink(missing_ok=True)


def disk_folder(tier: TierConfig, fingerprint: str) -> Path:
    return Path(tier.path or "") / fingerprint


def disk_entries(tier: TierConfig, fingerprint: str) -> list[tuple[BlockKey, int]]:
    """The entries a disk tier holds from earlier runs, with their sizes, least recently written first."""
    found = []
    for path in disk_folder(tier, fingerprint).glob("*"):
        key = parse_key_name(path.name)
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if key is not None:
            found.append((stat.st_mtime_ns, key, stat.st_size))
    return [(key, size) for _, key, size in sorted(found)]


def write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (raises OSError, ENOSPC when the disk is full)."""
    with open(path, "wb") as f:
        f.write(data)


class RedisStore(ByteStore):
    """Entries in a Redis server shared by every jido instance of the same fingerprint.

    Keys are ``jido:kv:<fingerprint>:<group>-<block hash>``; Redis evicts by its own ``maxmemory-policy``
    (``allkeys-lru`` makes it the LRU tier the hierarchy expects). Every call waits at most ``timeout_s``.
    """

    name = "remote"

    def __init__(self, tier: TierConfig, fingerprint: str) -> None:
        import redis  # the remote tier's client, needed only when one is configured

        self._errors = redis.exceptions.RedisError
        self.prefix = f"jido:kv:{fingerprint}:"
        self.client = redis.Redis.from_url(tier.url or "", socket_timeout=tier.timeout_s,
                                           socket_connect_timeout=tier.timeout_s, retry_on_timeout=False)

    def _key(self, key: BlockKey) -> str:
        return self.prefix + key_name(key)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self._errors as exc:
            raise StoreError(f"redis: {type(exc).__name__}: {exc}") from None

    def put(self, key: BlockKey, data: bytes) -> None:
        self._call(self.client.set, self._key(key), data)

    def get(self, key: BlockKey) -> bytes | None:
        return self._call(self.client.get, self._key(key))

    def delete(self, key: BlockKey) -> None:
        self._call(self.client.delete, self._key(key))

    def contains(self, keys: Sequence[BlockKey]) -> list[bool]:
        def run() -> list[bool]:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.exists(self._key(key))
            return [bool(n) for n in pipe.execute()]
        return self._call(run) if keys else []

    def close(self) -> None:
        self.client.close()


STORES: dict[str, type[ByteStore]] = {"cpu": CpuStore, "disk": DiskStore, "remote": RedisStore}


def make_store(tier: TierConfig, fingerprint: str) -> ByteStore:
    return STORES[tier.name](tier, fingerprint)


class WarnEvery:
    """Logs a tier's faults as warnings, at most once per ``interval_s`` per tier, with how many were skipped."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def __call__(self, tier: str, message: str) -> None:
        now = time.monotonic()
        if now - self._last.get(tier, -self.interval_s) < self.interval_s:
            self._skipped[tier] = self._skipped.get(tier, 0) + 1
            return
        skipped = self._skipped.pop(tier, 0)
        self._last[tier] = now
        more = f" ({skipped} more since the last warning)" if skipped else ""
        self.logger.warning("KV offload tier %s: %s; recomputing instead%s", tier, message, more)
