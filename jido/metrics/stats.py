"""Plain records of the engine's state and of one step, passed up from the core instead of read from it."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SchedulerStats:
    """The scheduler after a step (vLLM's ``SchedulerStats``): queues, KV usage, prefix-cache counters."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0  # cumulative prompt tokens looked up
    prefix_cache_hits: int = 0  # cumulative, of which found
    num_preemptions: int = 0  # cumulative
    kv_connector: tuple = ()  # the KV connector's cumulative records (KVTierStats per offload tier)
    pinned: tuple = ()  # PinnedPrefixStats per pinned prefix (cache-augmented generation)
    # Seconds the batching mode holds waiting requests back while nothing runs (dynamic batching waiting for its
    # batch to fill), unless more arrive; 0 when a step would admit them.
    admission_wait_s: float = 0.0


@dataclass(frozen=True)
class PinnedPrefixStats:
    """One pinned prefix: its blocks stay in the device pool until it is unpinned."""

    pin_id: str
    num_tokens: int  # tokens whose KV is pinned (whole blocks of the prompt)
    num_blocks: int  # pool blocks held, over every layer group
    hits: int = 0  # requests admitted whose cached prefix covered it


@dataclass(frozen=True)
class KVTierStats:
    """One KV offload tier since the engine started: lookups, transfers and faults, all cumulative."""

    tier: str  # cpu | disk | remote
    hits: int = 0  # blocks looked up and found here
    misses: int = 0  # blocks looked up here and not found
    stored_blocks: int = 0
    stored_bytes: int = 0
    loaded_blocks: int = 0
    loaded_bytes: int = 0
    load_seconds: float = 0.0  # summed over loaded blocks, reading and decoding
    errors: int = 0  # failed lookups, writes and reads, corrupt entries
    used_bytes: int = 0  # held now (local tiers)
    enabled: bool = True


@dataclass(frozen=True)
class IterationStats:
    """Where one step's time went and what it carried (vLLM's iteration stats)."""

    schedule_s: float = 0.0  # the scheduler's schedule()
    model_s: float = 0.0  # the forward pass and the logits of the sampled rows
    sample_s: float = 0.0  # the sampler
    update_s: float = 0.0  # update_from_output(): stop checks, outputs
    num_tokens: int = 0
    queue_times_s: tuple[float, ...] = field(default_factory=tuple)  # arrival -> first scheduled, this step
    prepare_s: float = 0.0  # the runner's input batch, positions and attention metadata
    # KV usage once the step's blocks were allocated, before finished requests freed theirs: the step's peak,
    # which SchedulerStats (taken after the step) misses for a request that finishes within it.
    kv_cache_usage_peak: float = 0.0
    num_reqs: int = 0  # requests the step computed tokens for: the batch size
