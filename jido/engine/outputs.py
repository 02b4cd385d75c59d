"""RequestOutput and CompletionOutput: what callers get back, shaped like vLLM's offline API."""
from __future__ import annotations

from dataclasses import dataclass, field

from jido.core.outputs import Logprobs


@dataclass
class Logprob:
    """One token's log-probability at one position, as vLLM's ``Logprob``: its rank (1 is the most likely) and text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per prompt position: None for the first token (nothing precedes it), then the prompt token and the top-N
# alternatives, each keyed by token id (the prompt token first). vLLM's ``PromptLogprobs``.
PromptLogprobs = list[dict[int, Logprob] | None]


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
    prompt_logprobs: PromptLogprobs | None = None  # when asked for; in a delta, only the one it arrives in
    # With the last output of a request a KV producer prefilled for a consumer: the handle to its KV (vLLM's).
    kv_transfer_params: dict | None = None

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
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        self.finished = delta.finished
        self.num_cached_tokens = delta.num_cached_tokens
        self.metrics = delta.metrics
        self.kv_transfer_params = delta.kv_transfer_params or self.kv_transfer_params
