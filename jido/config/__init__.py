"""Engine configuration by concern: frozen dataclasses validated on creation; the CLI is generated from them."""
from __future__ import annotations

from jido.config.cache import CacheConfig
from jido.config.engine import FLAT_CONFIGS, JSON_CONFIGS, EngineConfig, engine_keywords
from jido.config.kv_offload import KVOffloadConfig
from jido.config.kv_transfer import KVTransferConfig
from jido.config.model import DTYPES, DeviceConfig, ModelConfig
from jido.config.parallel import ParallelConfig
from jido.config.scheduler import SchedulerConfig
from jido.config.size import check_positive_int, parse_size
from jido.config.speculative import SpeculativeConfig

__all__ = ["CacheConfig", "DTYPES", "DeviceConfig", "EngineConfig", "FLAT_CONFIGS", "JSON_CONFIGS",
           "KVOffloadConfig", "KVTransferConfig", "ModelConfig", "ParallelConfig", "SchedulerConfig", "SpeculativeConfig",
           "check_positive_int", "engine_keywords", "parse_size"]
