"""SamplingParams: how one request samples and when it stops, validated when created."""
from __future__ import annotations

from dataclasses import dataclass, field

_GREEDY_EPS = 1e-5


@dataclass
class SamplingParams:
    """Per-request sampling and stopping settings, named as in vLLM's offline API.

    ``temperature == 0`` is greedy. ``top_k`` of 0 or -1 disables top-k. ``stop`` strings are matched on
    the detokenized text and removed from it unless ``include_stop_str_in_output``. ``max_tokens=None``
    generates until a stop condition or the model's length limit.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stop_strings: tuple[str, ...] = field(init=False, repr=False, default=())

    def __post_init__(self) -> None:
        _require(isinstance(self.n, int) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}")
        _require(_is_number(self.temperature) and self.temperature >= 0,
                 f"temperature must be >= 0 (0 means greedy), got {self.temperature!r}")
        _require(_is_number(self.top_p) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}")
        _require(isinstance(self.top_k, int) and self.top_k >= -1,
                 f"top_k must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        _require(_is_number(self.min_p) and 0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p!r}")
        _require(_is_number(self.repetition_penalty) and self.repetition_penalty > 0,
                 f"repetition_penalty must be > 0 (1 disables it), got {self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _require(_is_number(value) and -2 <= value <= 2, f"{name} must be in [-2, 2], got {value!r}")
        _require(self.seed is None or isinstance(self.seed, int), f"seed must be an integer, got {self.seed!r}")
        _require(self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
                 f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        _require(isinstance(self.min_tokens, int) and self.min_tokens >= 0,
                 f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        _require(self.max_tokens is None or self.min_tokens <= self.max_tokens,
                 f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        _require(self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= 20),
                 f"logprobs must be an integer in [0, 20], got {self.logprobs!r}")
        self.stop_strings = _normalize_stop(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        _require(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
                 f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def needs_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _normalize_stop(stop: list[str] | str | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else list(stop)
    _require(all(isinstance(s, str) and s for s in items), f"stop must be non-empty strings, got {stop!r}")
    return tuple(items)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
