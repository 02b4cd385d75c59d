"""SpeculativeConfig: vLLM's ``--speculative-config`` JSON, validated."""
from __future__ import annotations

from dataclasses import dataclass

from jido.config.size import check_positive_int

SPECULATIVE_METHODS = ("ngram", "draft_model", "medusa", "eagle")
# With ``"num_speculative_tokens": "auto"`` K is chosen per step in 0..AUTO_MAX_SPECULATIVE_TOKENS: the
# scheduler keeps that many lookahead slots free after every running request.
AUTO_MAX_SPECULATIVE_TOKENS = 8
# The largest K taken. A draft's position i is accepted only if every earlier one was, so at a per-token
# acceptance rate a, positions past K add a**K / (1 - a) expected tokens a step: 0.34 at K = 32 even for
# a = 0.9 (above what drafts reach outside verbatim copying), while each position costs every running
# request a verify row and a lookahead KV slot per step, and /metrics a per-position series.
MAX_SPECULATIVE_TOKENS = 32


@dataclass(frozen=True)
class SpeculativeConfig:
    """How tokens are proposed, and how many per request and step (``num_speculative_tokens``).

    ``ngram`` proposes the continuation of the latest earlier occurrence of the last n tokens
    (``prompt_lookup_max`` down to ``prompt_lookup_min``) in the prompt and output. ``draft_model`` runs
    a smaller model with the target's tokenizer (``model``: a path or named model), or the target's own
    first ``num_layers`` layers and LM head. ``medusa`` / ``eagle`` run heads trained by
    ``jido train-draft`` (``model``: their folder) on the target's hidden states.
    """

    method: str
    num_speculative_tokens: int | str
    model: str | None = None
    num_layers: int | None = None  # draft_model without a model: the target's first N layers as the draft
    quantization: str | None = None  # the draft model's --quantization (default: as for the target)
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(SPECULATIVE_METHODS)}, got {self.method!r}")
        if self.num_speculative_tokens != "auto":
            if isinstance(self.num_speculative_tokens, str):
                raise ValueError(f"num_speculative_tokens must be a positive integer or 'auto', got "
                                 f"{self.num_speculative_tokens!r}")
            check_positive_int("num_speculative_tokens", self.num_speculative_tokens)
            if self.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
                raise ValueError(f"num_speculative_tokens must be at most {MAX_SPECULATIVE_TOKENS} (later draft "
                                 f"positions are almost never accepted, and each costs a verify row per request "
                                 f"and step), got {self.num_speculative_tokens}; or 'auto'")
        check_positive_int("prompt_lookup_min", self.prompt_lookup_min)
        check_positive_int("prompt_lookup_max", self.prompt_lookup_max)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min ({self.prompt_lookup_min}) exceeds prompt_lookup_max "
                             f"({self.prompt_lookup_max})")
        if self.num_layers is not None:
            check_positive_int("num_layers", self.num_layers)
            if self.method != "draft_model" or self.model is not None:
                raise ValueError("num_layers makes the target's first layers the draft: it needs method "
                                 "'draft_model' and no 'model'")
        if self.method == "draft_model" and not self.model and self.num_layers is None:
            raise ValueError("speculative method 'draft_model' needs a 'model' (a smaller model with the target's "
                             "tokenizer) or 'num_layers' (the target's first N layers as the draft)")
        if self.method in ("medusa", "eagle") and not self.model:
            raise ValueError(f"speculative method {self.method!r} needs a 'model': the folder "
                             f"`jido train-draft --method {self.method}` wrote")

    @property
    def is_auto(self) -> bool:
        return self.num_speculative_tokens == "auto"

    @property
    def max_num_speculative_tokens(self) -> int:
        """The most tokens proposed per request and step: the scheduler's lookahead."""
        return AUTO_MAX_SPECULATIVE_TOKENS if self.is_auto else int(self.num_speculative_tokens)
