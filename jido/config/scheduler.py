"""SchedulerConfig: how many requests and tokens one step may carry."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from jido.config.size import check_positive_int

SchedulingPolicy = Literal["fcfs", "lpm", "priority"]
PreemptionMode = Literal["recompute", "swap"]


@dataclass(frozen=True)
class SchedulerConfig:
    """How much one engine step may carry."""

    max_num_seqs: int = 128
    """Requests running at once (one step computes a token or a prompt chunk for each)."""
    max_num_batched_tokens: int = 2048
    """Tokens one step computes; longer prompts are prefilled in chunks."""
    scheduling_policy: SchedulingPolicy = "fcfs"
    """Order of admission: fcfs (arrival), lpm (longest cached prefix first, bounded so none starves), priority
    (each request's priority, lower first; under memory pressure the least urgent is preempted)."""

    preemption_mode: PreemptionMode = "recompute"
    """What a request preempted for lack of blocks loses: recompute (its blocks go back to the cache; what was
    evicted meanwhile is recomputed) or swap (its blocks are copied to a CPU tier and loaded back: kv_offload's
    cpu tier, or a 4 GiB one when kv_offload is unset)."""

    def __post_init__(self) -> None:
        if self.preemption_mode not in get_args(PreemptionMode):
            raise ValueError(f"preemption_mode must be one of {list(get_args(PreemptionMode))}, "
                             f"got {self.preemption_mode!r}")
        if self.scheduling_policy not in get_args(SchedulingPolicy):
            raise ValueError(f"scheduling_policy must be one of {list(get_args(SchedulingPolicy))}, "
                             f"got {self.scheduling_policy!r}")
        check_positive_int("max_num_seqs", self.max_num_seqs)
        check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
