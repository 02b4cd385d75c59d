"""SamplingParams: how one request samples and when it stops, validated when created."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

_GREEDY_EPS = 1e-5
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FLOAT32_MAX = 3.4028234663852886e38
_MAX_SHOWN = 80  # characters of a bad value an error message repeats
_FINITE = f"finite (at most {_FLOAT32_MAX:.4g}, the largest float32)"


@dataclass
class StructuredOutputsParams:
    """A constraint on the generated text, enforced token by token by the grammar engine (vLLM's names).

    Exactly one of ``json`` (a JSON schema, as a dict or its text), ``regex``, ``choice`` (the output is one
    of these strings), ``grammar`` (a Lark grammar, or GBNF with ``::=`` rules) or ``json_object`` (any JSON
    object) is set. ``disable_any_whitespace`` keeps JSON compact (no whitespace between its tokens); unlike
    vLLM it defaults to True: with whitespace allowed, Gemma 3 270M's greedy JSON spun in whitespace until
    ``max_tokens`` on 1 of 3 prompts.
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = True

    def __post_init__(self) -> None:
        _require(self.json is None or isinstance(self.json, (str, dict)),
                 f"structured_outputs.json must be a JSON schema (an object or its text), got {_show(self.json)}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            _require(value is None or (isinstance(value, str) and value),
                     f"structured_outputs.{name} must be a non-empty string, got {_show(value)}")
        _require(self.choice is None or (isinstance(self.choice, (list, tuple)) and self.choice
                                         and all(isinstance(c, str) for c in self.choice)),
                 f"structured_outputs.choice must be a non-empty list of strings, got {_show(self.choice)}")
        _require(self.json_object in (None, True, False),
                 f"structured_outputs.json_object must be true or false, got {_show(self.json_object)}")
        kinds = self.kinds
        _require(len(kinds) == 1, "structured_outputs must set exactly one of json, regex, choice, grammar or "
                                  f"json_object, got {', '.join(kinds) if kinds else 'none'}")

    @property
    def kinds(self) -> list[str]:
        """The constraint fields set (exactly one once validated)."""
        return [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None] + \
            (["json_object"] if self.json_object else [])


@dataclass
class SamplingParams:
    """Per-request sampling and stopping settings, named as in vLLM's offline API.

    ``temperature == 0`` is greedy. ``top_k`` of 0 or -1 disables top-k. ``stop`` strings are matched on
    the detokenized text and removed from it unless ``include_stop_str_in_output``. ``max_tokens=None``
    generates until a stop condition or the model's length limit.

    ``logprobs`` asks for each generated token's log-probability and the top-N alternatives;
    ``prompt_logprobs`` for each prompt token's, given the tokens before it (the first has none), which is
    what scoring a text needs. With ``prompt_logprobs``, ``max_tokens=0`` is allowed: the request ends
    after its prompt is computed, with no generated token.
    """

    n: int = 1
    """Completions to generate for the prompt."""
    temperature: float = 1.0
    """Softmax temperature; 0 is greedy."""
    top_p: float = 1.0
    """Sample from the smallest set of tokens whose probabilities add up to this, in (0, 1]."""
    top_k: int = 0
    """Sample from the k likeliest tokens; 0 or -1 disables it."""
    min_p: float = 0.0
    """Drop tokens less likely than this fraction of the likeliest one, in [0, 1]."""
    repetition_penalty: float = 1.0
    """Divide positive logits (multiply negative ones) of tokens seen in the prompt or output; 1 disables it."""
    presence_penalty: float = 0.0
    """Subtract from the logits of tokens already generated, in [-2, 2]."""
    frequency_penalty: float = 0.0
    """Subtract this times the count of each token already generated, in [-2, 2]."""
    seed: int | None = None
    """Seed for this request's sampling: the same seed gives the same tokens, batched or not (default: none)."""
    max_tokens: int | None = 16
    """Tokens to generate at most (None in the API: until a stop or the model's length limit)."""
    min_tokens: int = 0
    """Tokens to generate before EOS or a stop token may end the output."""
    stop: list[str] | str | None = None
    """Strings that end the output, matched on the detokenized text."""
    stop_token_ids: list[int] | None = None
    """Token ids that end the output, besides the model's EOS."""
    ignore_eos: bool = False
    """Keep generating past EOS."""
    logprobs: int | None = None
    """Log-probabilities of the sampled token and the top N at each position, N in [0, 20]."""
    prompt_logprobs: int | None = None
    """Log-probabilities of each prompt token given the ones before it, with the top N, N in [0, 20]."""
    include_stop_str_in_output: bool = False
    """Keep the matched stop string at the end of the text."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the detokenized text."""
    structured_outputs: StructuredOutputsParams | None = None
    """A JSON schema, regex, choice or grammar the output must follow (enforced by the grammar engine)."""
    stop_strings: tuple[str, ...] = field(init=False, repr=False, default=())

    def __post_init__(self) -> None:
        _check_int("n", self.n, 1)
        _check_real("temperature", self.temperature, lambda t: t >= 0, f">= 0 (0 means greedy) and {_FINITE}")
        _check_real("top_p", self.top_p, lambda p: 0 < p <= 1, "in (0, 1]")
        _check_int("top_k", self.top_k, -1, allowed="-1, 0 (disabled) or a positive integer")
        _check_real("min_p", self.min_p, lambda p: 0 <= p <= 1, "in [0, 1]")
        _check_real("repetition_penalty", self.repetition_penalty, lambda r: r > 0,
                    f"> 0 (1 disables it) and {_FINITE}")
        for name in ("presence_penalty", "frequency_penalty"):
            _check_real(name, getattr(self, name), lambda x: -2 <= x <= 2, "in [-2, 2]")
        _check_int("seed", self.seed, _INT64_MIN, optional=True)
        _check_int("prompt_logprobs", self.prompt_logprobs, 0, 20, optional=True)
        scoring_only = self.prompt_logprobs is not None  # then max_tokens=0 asks for the prompt's logprobs alone
        _check_int("max_tokens", self.max_tokens, 0 if scoring_only else 1, optional=True,
                   allowed=None if scoring_only else "an integer >= 1 (0 only with prompt_logprobs)")
        _check_int("min_tokens", self.min_tokens, 0)
        _require(self.max_tokens is None or self.min_tokens <= self.max_tokens,
                 f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        _check_int("logprobs", self.logprobs, 0, 20, optional=True)
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            flag = getattr(self, name)
            _require(isinstance(flag, bool), f"{name} must be true or false, got {_show(flag)}")
        _require(self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
                 "structured_outputs must be a StructuredOutputsParams, got "
                 f"{type(self.structured_outputs).__name__}")
        self.stop_strings = _normalize_stop(self.stop)
        self.stop_token_ids = _normalize_stop_token_ids(self.stop_token_ids)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def needs_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _check_int(name: str, value: object, low: int, high: int = _INT64_MAX, allowed: str | None = None,
               optional: bool = False) -> None:
    """Raise ValueError unless ``value`` is an int (not a bool) in [low, high], or None when ``optional``."""
    if (optional and value is None) or (_is_int(value) and low <= value <= high):
        return
    if allowed is None:
        allowed = (f"an integer in [{low}, {high}]" if high != _INT64_MAX
                   else f"an integer >= {low}" if low > _INT64_MIN else "an integer")
    if high == _INT64_MAX:
        allowed += " that fits in an int64"
    raise ValueError(f"{name} must be {allowed}, got {_show(value)}")


def _check_real(name: str, value: object, ok: Callable[[float], bool], allowed: str) -> None:
    """Raise ValueError unless ``value`` is an int or float, finite as a float32, for which ``ok`` holds."""
    # The sampler computes in float32: a larger value would become inf there (and inf / inf NaN).
    number = _as_float(value)
    if number is None or not abs(number) <= _FLOAT32_MAX or not ok(number):
        raise ValueError(f"{name} must be {allowed}, got {_show(value)}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_float(value: object) -> float | None:
    """``value`` as a float (inf when too large for one), or None when it is not a number."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _show(value: object) -> str:
    """``value`` for an error message, short even for huge integers or long lists."""
    if _is_int(value) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (list, tuple, dict)) and any(_is_int(v) and v.bit_length() > 64 for v in value):
        return f"a {type(value).__name__} holding an integer of more than 64 bits"
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "..."


def _normalize_stop(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else list(stop) if isinstance(stop, (list, tuple)) else None
    _require(items is not None and all(isinstance(s, str) and s for s in items),
             f"stop must be non-empty strings (a string or a list of strings), got {_show(stop)}")
    return tuple(items)


def _normalize_stop_token_ids(stop_token_ids: object) -> list[int]:
    ok = stop_token_ids is None or (isinstance(stop_token_ids, (list, tuple))
                                    and all(_is_int(t) and 0 <= t <= _INT64_MAX for t in stop_token_ids))
    _require(ok, "stop_token_ids must be a list of non-negative integers that fit in an int64, "
                 f"got {_show(stop_token_ids)}")
    return list(stop_token_ids or [])


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
