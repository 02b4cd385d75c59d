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
    text_offset: int = 0  # in a delta: where ``text`` starts in the whole text (a stop string can cut back)

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

    def add(self, delta: RequestOutput) -> None:
        """Merge the next delta of this request (from ``LLMEngine.step``) into this cumulative output.

        Costs what the delta carries, not what was generated before, except the text's concatenation.
        """
        for whole, new in zip(self.outputs, delta.outputs):
            whole.text = whole.text[:new.text_offset] + new.text
            whole.token_ids.extend(new.token_ids)
            if whole.logprobs is not None and new.logprobs is not None:
                whole.logprobs.extend(new.logprobs)
            whole.cumulative_logprob = new.cumulative_logprob
            whole.finish_reason, whole.stop_reason = new.finish_reason, new.stop_reason
        self.finished = delta.finished
        self.num_cached_tokens = delta.num_cached_tokens
        self.metrics = delta.metrics
