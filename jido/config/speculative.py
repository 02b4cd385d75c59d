"""SpeculativeConfig: vLLM's ``--speculative-config`` JSON, validated."""
from __future__ import annotations

from dataclasses import dataclass

from jido.config.size import check_positive_int

SPECULATIVE_METHODS = ("ngram", "draft_model", "medusa", "eagle")


@dataclass(frozen=True)
class SpeculativeConfig:
    """How tokens are proposed and how many per step (``num_speculative_tokens``, the scheduler's lookahead)."""

    method: str
    num_speculative_tokens: int
    model: str | None = None
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(SPECULATIVE_METHODS)}, got {self.method!r}")
        check_positive_int("num_speculative_tokens", self.num_speculative_tokens)
        check_positive_int("prompt_lookup_min", self.prompt_lookup_min)
        check_positive_int("prompt_lookup_max", self.prompt_lookup_max)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min ({self.prompt_lookup_min}) exceeds prompt_lookup_max "
                             f"({self.prompt_lookup_max})")
        if self.method == "draft_model" and not self.model:
            raise ValueError("speculative method 'draft_model' needs a 'model'")
