"""Byte stores across restarts: a disk tier's entries outlive the process and the next run indexes them."""
from __future__ import annotations

import os

from jido.config.kv_offload import KVOffloadConfig
from jido.core.kv_cache_spec import FullAttentionSpec, make_kv_cache_config
from jido.kvtransfer.offload_metadata import MoveEntry
from jido.kvtransfer.offload_scheduler import OffloadScheduler
from jido.offload.stores import DiskStore, disk_entries, key_name

FINGERPRINT = "0123456789abcdef0123456789abcdef"
KEYS = [(0, bytes([i]) * 16) for i in range(3)]


def _write_entries(path: str, sizes: list[int]) -> KVOffloadConfig:
    """Entries of ``sizes`` bytes under KEYS, written in reverse key order (KEYS[2] is the oldest)."""
    config = KVOffloadConfig(disk={"path": path, "size": "1MiB"})
    store = DiskStore(config.tiers[0], FINGERPRINT)
    for age, (key, size) in enumerate(zip(reversed(KEYS), reversed(sizes))):
        store.put(key, bytes(size))
        os.utime(os.path.join(path, FINGERPRINT, key_name(key)), ns=(age * 10**9, age * 10**9))
    return config


def test_a_disk_store_keeps_its_entries_for_the_next_run_and_drops_half_written_ones(tmp_path):
    config = _write_entries(str(tmp_path), [10, 20, 30])
    (tmp_path / FINGERPRINT / "0-00.partial").write_bytes(b"half")
    store = DiskStore(config.tiers[0], FINGERPRINT)
    assert disk_entries(config.tiers[0], FINGERPRINT) == [(KEYS[2], 30), (KEYS[1], 20), (KEYS[0], 10)]
    assert store.get(KEYS[1]) == bytes(20) and not (tmp_path / FINGERPRINT / "0-00.partial").exists()


def test_the_offload_scheduler_indexes_the_newest_disk_entries_its_budget_holds(tmp_path):
    _write_entries(str(tmp_path), [400, 400, 400])
    config = KVOffloadConfig(disk={"path": str(tmp_path), "size": "1000B"})
    kv_cache_config = make_kv_cache_config({0: FullAttentionSpec(4, 1, 16, 4)}, 1 << 16)
    scheduler = OffloadScheduler(config, kv_cache_config, FINGERPRINT)
    disk = scheduler.local["disk"]
    assert list(disk.entries) == [KEYS[1], KEYS[0]] and disk.used == 800
    assert scheduler.has_pending_work()  # the first step deletes the oldest, which the budget has no room for
    assert scheduler.build_connector_meta(None, lambda request_id: []).moves == [MoveEntry(KEYS[2], "disk", None)]
