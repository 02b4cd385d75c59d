"""SchedulerConfig: how many requests and tokens one step may carry."""
from __future__ import annotations

from dataclasses import dataclass

from jido.config.size import check_positive_int


@dataclass(frozen=True)
class SchedulerConfig:
    """How much one engine step may carry."""

    max_num_seqs: int = 128
    """Requests running at once (one step computes a token or a prompt chunk for each)."""
    max_num_batched_tokens: int = 2048
    """Tokens one step computes; longer prompts are prefilled in chunks."""

    def __post_init__(self) -> None:
        check_positive_int("max_num_seqs", self.max_num_seqs)
        check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
