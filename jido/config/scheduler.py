"""SchedulerConfig: how many requests and tokens one step may carry."""
from __future__ import annotations

from dataclasses import dataclass

from jido.config.size import check_positive_int


@dataclass(frozen=True)
class SchedulerConfig:
    """Prompts longer than ``max_num_batched_tokens`` are prefilled in chunks."""

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048

    def __post_init__(self) -> None:
        check_positive_int("max_num_seqs", self.max_num_seqs)
        check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
