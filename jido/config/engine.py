"""EngineConfig: every concern's config in one frozen object, built from flat keyword arguments."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from jido.config.cache import CacheConfig
from jido.config.kv_offload import KVOffloadConfig
from jido.config.kv_transfer import KVTransferConfig
from jido.config.model import DeviceConfig, ModelConfig
from jido.config.parallel import ParallelConfig
from jido.config.scheduler import SchedulerConfig
from jido.config.speculative import SpeculativeConfig

DEFAULT_SWAP_SPACE = "4GiB"  # the CPU tier preemption_mode="swap" adds when kv_offload has none
# The configs whose fields are flat flags (``--block-size``) and ``LLM(...)`` keywords.
FLAT_CONFIGS: tuple[type, ...] = (ModelConfig, DeviceConfig, CacheConfig, SchedulerConfig, ParallelConfig)
# The configs given whole, as a dict or JSON text (``--speculative-config '{"method": ...}'``).
JSON_CONFIGS: dict[str, type] = {"speculative_config": SpeculativeConfig, "kv_transfer_config": KVTransferConfig,
                                 "kv_offload": KVOffloadConfig}


@dataclass(frozen=True)
class EngineConfig:
    """The engine's configuration by concern, as vLLM's ``VllmConfig``; each part validates itself."""

    model_config: ModelConfig = field(default_factory=ModelConfig)
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    speculative_config: SpeculativeConfig | None = None
    kv_transfer_config: KVTransferConfig | None = None
    kv_offload: KVOffloadConfig | None = None

    def __post_init__(self) -> None:
        # Swapping preempted requests out needs a CPU tier to swap to: vLLM's default swap space, 4 GiB (a
        # budget, not an allocation). A tier the size of the pool was too small: every decode step releases
        # the blocks sliding windows passed, and the tier's LRU dropped the preempted request's before it resumed.
        if self.scheduler_config.preemption_mode == "swap":
            offload = self.kv_offload
            if offload is None:
                object.__setattr__(self, "kv_offload", KVOffloadConfig(cpu=DEFAULT_SWAP_SPACE))
            elif offload.cpu is None:
                raise ValueError("preemption_mode='swap' swaps to kv_offload's cpu tier: add \"cpu\": SIZE to it")
        # A KV hand-off names one engine's blocks and endpoint; replicas behind one server would each need
        # their own, and the router already balances over separate servers.
        if self.kv_transfer_config is not None and self.parallel_config.data_parallel_size > 1:
            raise ValueError("kv_transfer_config takes one replica (data_parallel_size 1): run one jido serve per "
                             "replica and put jido router in front of them")
        if self.speculative_config is not None:
            self._check_speculation_alone()

    def _check_speculation_alone(self) -> None:
        # The proposers and the rejection sampler hold whole-model state on one rank, and a consumer's loaded
        # KV has never been checked against a draft's catch-up: refused rather than run untested.
        parallel = self.parallel_config
        if parallel.tensor_parallel_size > 1 or parallel.pipeline_parallel_size > 1:
            raise ValueError("speculative_config runs on one rank: tensor_parallel_size and pipeline_parallel_size "
                             "must be 1 (data_parallel_size may be more)")
        if self.kv_transfer_config is not None:
            raise ValueError("speculative_config and kv_transfer_config cannot be combined yet: speculate on a "
                             "co-located server")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Route flat keywords (``block_size=32``, ``dtype="bfloat16"``) to the config that owns each.

        Raises:
            TypeError: a keyword no config has (the message lists the accepted ones).
            ValueError: a value its config rejects.
        """
        unknown = set(kwargs) - set(engine_keywords())
        if unknown:
            raise TypeError(f"unknown engine setting(s) {sorted(unknown)}; accepted: {engine_keywords()}")
        parts: dict[str, Any] = {}
        for config_cls in FLAT_CONFIGS:
            own = {f.name: kwargs[f.name] for f in dataclasses.fields(config_cls) if f.name in kwargs}
            parts[_part_name(config_cls)] = config_cls(**own)
        for name, config_cls in JSON_CONFIGS.items():
            parts[name] = _json_config(name, config_cls, kwargs.get(name))
        return cls(**parts)


def engine_keywords() -> list[str]:
    """Every keyword :meth:`EngineConfig.from_kwargs` accepts."""
    flat = [f.name for config_cls in FLAT_CONFIGS for f in dataclasses.fields(config_cls)]
    return sorted([*flat, *JSON_CONFIGS])


def _part_name(config_cls: type) -> str:
    # ModelConfig -> model_config, SchedulerConfig -> scheduler_config
    return config_cls.__name__[: -len("Config")].lower() + "_config"


def _json_config(name: str, config_cls: type, value: Any) -> Any:
    if value is None or isinstance(value, config_cls):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict or JSON object, got {type(value).__name__}")
    known = {f.name for f in dataclasses.fields(config_cls)}
    if set(value) - known:
        raise ValueError(f"{name}: unknown key(s) {sorted(set(value) - known)}; known: {sorted(known)}")
    try:
        return config_cls(**value)
    except TypeError as exc:  # a required key is missing
        raise ValueError(f"{name}: {exc}") from None
