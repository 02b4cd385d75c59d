"""RequestOutput and CompletionOutput: what callers get back, shaped like vLLM's offline API."""
from __future__ import annotations

from dataclasses import dataclass, field

from jido.core.outputs import Logprobs


@dataclass
class CompletionOutput:
    """One generated sequence of a request (a request with ``n > 1`` has several)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[Logprobs] | None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's prompt and its completions so far."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
