"""Plain records of the engine's state and of one step, passed up from the core instead of read from it."""
from __future__ import annotations

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
    spec_decoding: SpecDecodingStats = field(default_factory=SpecDecodingStats)  # cumulative


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
    propose_s: float = 0.0  # speculative decoding: proposing the next step's tokens (a draft model's passes)
