"""The offload connector: LMCache-style tiers below the device pool, its two halves under one name."""
from __future__ import annotations

from jido.kvtransfer.offload_scheduler import OffloadScheduler
from jido.kvtransfer.offload_worker import OffloadWorker

__all__ = ["OffloadScheduler", "OffloadWorker"]
