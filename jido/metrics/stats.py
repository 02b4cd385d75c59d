"""Plain records of the engine's state and of one step, passed up from the core instead of read from it."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SpecDecodingStats:
    """Speculative decoding totals since the start (vLLM's ``SpecDecodingStats``, kept cumulative).

    A draft is one request's proposals verified in one step; ``num_accepted_tokens_per_pos[i]`` counts the
    drafts whose first ``i + 1`` proposals were all accepted, so position ``i``'s acceptance rate is that
    count over the drafts that had a position ``i``.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: tuple[int, ...] = ()

    def observed(self, num_draft_tokens: int, num_accepted_tokens: int) -> SpecDecodingStats:
        """These totals with one more draft of ``num_draft_tokens`` of which the first ``num_accepted_tokens`` held."""
        per_pos = list(self.num_accepted_tokens_per_pos)
        per_pos.extend([0] * (num_draft_tokens - len(per_pos)))
        for pos in range(num_accepted_tokens):
            per_pos[pos] += 1
        return SpecDecodingStats(self.num_drafts + 1, self.num_draft_tokens + num_draft_tokens,
                                 self.num_accepted_tokens + num_accepted_tokens, tuple(per_pos))


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
    spec_decoding: SpecDecodingStats = field(default_factory=SpecDecodingStats)  # cumulative
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
    expert_load: tuple[int, ...] = ()  # (token, expert) pairs per expert-parallel rank (MoE models)
    propose_s: float = 0.0  # speculative decoding: proposing the next step's tokens (a draft model's passes)


def merge_scheduler_stats(stats: Sequence[SchedulerStats]) -> SchedulerStats:
    """Several replicas' stats as one engine's: counts and queues summed, KV usage averaged (the replicas' pools
    are equal), the connector's records (offload tiers, transfers) summed by what they name, every replica's
    pinned prefixes listed."""
    summed = {f.name: sum(getattr(s, f.name) for s in stats) for f in dataclasses.fields(SchedulerStats)
              if f.name not in ("kv_connector", "pinned", "spec_decoding", "admission_wait_s")}
    summed["kv_cache_usage"] /= max(len(stats), 1)
    summed["admission_wait_s"] = max((s.admission_wait_s for s in stats), default=0.0)
    summed["spec_decoding"] = _merge_spec(s.spec_decoding for s in stats)
    groups: dict[tuple, list] = {}
    for record in (r for s in stats for r in s.kv_connector):
        groups.setdefault(_record_key(record), []).append(record)
    merged = tuple(_merge_records(records) for records in groups.values())
    return SchedulerStats(**summed, kv_connector=merged, pinned=tuple(p for s in stats for p in s.pinned))


def _merge_spec(stats: Iterable[SpecDecodingStats]) -> SpecDecodingStats:
    """Replicas' speculation totals as one's: counts summed, per position too (over the longest drafts)."""
    stats = list(stats)
    width = max((len(s.num_accepted_tokens_per_pos) for s in stats), default=0)
    per_pos = [sum(s.num_accepted_tokens_per_pos[i] for s in stats if i < len(s.num_accepted_tokens_per_pos))
               for i in range(width)]
    return SpecDecodingStats(sum(s.num_drafts for s in stats), sum(s.num_draft_tokens for s in stats),
                             sum(s.num_accepted_tokens for s in stats), tuple(per_pos))


def _record_key(record: object) -> tuple:
    """A connector record's identity: its type and its text fields (a tier's name; a transfer's role, transport)."""
    return (type(record), *(v for f in dataclasses.fields(record) if isinstance(v := getattr(record, f.name), str)))


def _merge_records(records: list) -> object:
    """Records of one identity as one: numbers summed, flags kept only if every replica's is set."""
    values = {}
    for f in dataclasses.fields(records[0]):
        column = [getattr(r, f.name) for r in records]
        if isinstance(column[0], bool):
            values[f.name] = all(column)
        elif isinstance(column[0], (int, float)):
            values[f.name] = sum(column)
        else:
            values[f.name] = column[0]
    return type(records[0])(**values)


@dataclass(frozen=True)
class KVTransferStats:
    """KV moved between prefill and decode instances since the engine started (cumulative, one per engine).

    ``sent_*`` count what this instance's KV endpoint handed out (pulls served, pushes acknowledged);
    ``received_*`` the loads that filled this instance's blocks, ``failed`` the loads that fell back to a
    local prefill; ``expired`` held hand-offs whose lease ran out before a consumer released them.
    """

    role: str
    transport: str
    sent: int = 0
    sent_bytes: int = 0
    sent_seconds: float = 0.0
    received: int = 0
    received_bytes: int = 0
    received_tokens: int = 0
    received_seconds: float = 0.0
    failed: int = 0
    expired: int = 0
    push_refused: int = 0
    held: int = 0  # hand-offs held now
