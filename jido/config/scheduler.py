"""SchedulerConfig: how many requests and tokens one step may carry, and when waiting requests join."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from jido.config.size import check_positive_int

SchedulingPolicy = Literal["fcfs", "lpm", "priority"]
PreemptionMode = Literal["recompute", "swap"]
SchedulingMode = Literal["continuous", "dynamic", "static"]
SCHEDULING_MODES: tuple[str, ...] = get_args(SchedulingMode)


@dataclass(frozen=True)
class SchedulerConfig:
    """How much one engine step may carry, and when waiting requests join the running batch."""

    max_num_seqs: int = 128
    """Requests running at once (one step computes a token or a prompt chunk for each)."""
    max_num_batched_tokens: int = 2048
    """Tokens one step computes; longer prompts are prefilled in chunks."""
    max_num_prefill_tokens_while_decoding: int = 512
    """Prompt tokens one step computes while other requests decode in it: a long prompt is prefilled in chunks
    this small then, so the running streams wait for one small chunk between tokens, not a full budget's worth."""
    scheduling_policy: SchedulingPolicy = "fcfs"
    """Order of admission: fcfs (arrival), lpm (longest cached prefix first, bounded so none starves), priority
    (each request's priority, lower first; under memory pressure the least urgent is preempted)."""

    preemption_mode: PreemptionMode = "recompute"
    """What a request preempted for lack of blocks loses: recompute (its blocks go back to the cache; what was
    evicted meanwhile is recomputed) or swap (its blocks are copied to a CPU tier and loaded back: kv_offload's
    cpu tier, or a 4 GiB one when kv_offload is unset)."""
    enable_chunked_prefill: bool = True
    """Split a prompt longer than the step's token budget across steps; off, every prompt is computed whole in
    one step, so max_model_len is capped at max_num_batched_tokens."""
    scheduling_mode: SchedulingMode = "continuous"
    """When waiting requests join: continuous (whenever a slot is free, every step), dynamic (a batch forms once
    max_num_seqs requests wait or the oldest has waited max_batch_wait_ms, and runs to completion before the
    next forms), static (the requests waiting when the last batch ended, up to max_num_seqs, run to completion)."""
    max_batch_wait_ms: float = 100.0
    """dynamic: how long the oldest waiting request waits for its batch to fill before it runs part-full."""

    def __post_init__(self) -> None:
        if self.preemption_mode not in get_args(PreemptionMode):
            raise ValueError(f"preemption_mode must be one of {list(get_args(PreemptionMode))}, "
                             f"got {self.preemption_mode!r}")
        if self.scheduling_policy not in get_args(SchedulingPolicy):
            raise ValueError(f"scheduling_policy must be one of {list(get_args(SchedulingPolicy))}, "
                             f"got {self.scheduling_policy!r}")
        check_positive_int("max_num_seqs", self.max_num_seqs)
        check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        check_positive_int("max_num_prefill_tokens_while_decoding", self.max_num_prefill_tokens_while_decoding)
        if self.scheduling_mode not in SCHEDULING_MODES:
            raise ValueError(f"scheduling_mode must be one of {', '.join(SCHEDULING_MODES)}, "
                             f"got {self.scheduling_mode!r}")
        wait = self.max_batch_wait_ms
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < math.inf:
            raise ValueError(f"max_batch_wait_ms must be a finite number of milliseconds >= 0, got {wait!r}")
