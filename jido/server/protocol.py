"""The OpenAI request bodies jido accepts (with vLLM's sampling extras), as pydantic models."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from jido.core.sampling_params import SamplingParams

# Fields passed to SamplingParams unchanged when the client sets them.
_SAMPLING_FIELDS = ("n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                    "frequency_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens",
                    "include_stop_str_in_output", "skip_special_tokens")


class _Body(BaseModel):
    # Strict: "5" is not a number. Unknown fields (user, tools, ...) are ignored, as vLLM does.
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class _SamplingBody(_Body):
    """Fields shared by completions and chat. ``stop`` is checked by SamplingParams, which says why."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: Any = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """SamplingParams for this body; raises ValueError (a 400) for out-of-range values."""
        given = {name: getattr(self, name) for name in _SAMPLING_FIELDS if getattr(self, name) is not None}
        return SamplingParams(max_tokens=max_tokens, logprobs=logprobs, **given)


class CompletionRequest(_SamplingBody):
    """POST /v1/completions. ``prompt`` is text or token ids (checked by the engine); one per request."""

    prompt: Any
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: Literal[False] = False


class ChatMessage(_Body):
    """One message; ``content`` is text or a list of ``{"type": "text", "text": ...}`` parts."""

    role: str
    content: Any = None


class ChatCompletionRequest(_SamplingBody):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_messages(self) -> list[dict[str, str]]:
        """Messages with text content, as chat templates expect; raises ValueError for other content."""
        return [{"role": m.role, "content": _text_content(m.content, i)} for i, m in enumerate(self.messages)]


def _text_content(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if all(p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            return "".join(p["text"] for p in content)
    raise ValueError(f"messages[{index}].content must be a string or a list of "
                     '{"type": "text", "text": "..."} parts (jido serves text-only models)')
