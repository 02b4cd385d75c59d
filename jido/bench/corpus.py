"""Token-exact prompts cut from a text (the load generator's: the reference text, jido/utils/reference_text.py)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from jido.bench.tokens import TokenCounter


@dataclass
class Corpus:
    """Text with its tokens, so a prompt of exactly n tokens starts at any token."""

    text: str
    counter: TokenCounter

    @cached_property
    def tokens(self) -> Sequence[Any]:
        tokens = self.counter.tokenize(self.text)
        if len(tokens) < 2:
            raise ValueError("the corpus has fewer than 2 tokens")
        return tokens

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def window(self, start: int, num_tokens: int) -> str:
        """num_tokens tokens of text from token `start`, wrapping to the beginning at the end."""
        pieces, start = [], start % self.num_tokens
        while num_tokens > 0:
            take = min(num_tokens, self.num_tokens - start)
            pieces.append(self.counter.text_of(self.text, self.tokens, start, start + take))
            num_tokens -= take
            start = 0
        return "\n\n".join(pieces)
