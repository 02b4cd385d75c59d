"""Token counting for prompt lengths: words and punctuation by default, a tokenizer.json when given one."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

_WORD = re.compile(r"\w+|[^\w\s]")


class TokenCounter(Protocol):
    """Splits text into tokens, returned as (start, end) character offsets in order.

    The bench has no engine tokenizer: with no tokenizer.json, a "token" is a word or a punctuation mark,
    which on English prose lands within ~25% of a BPE count. Offsets let prompts be cut from real text at
    an exact token count without decoding ids.
    """

    name: str

    def spans(self, text: str) -> list[tuple[int, int]]: ...


class WordCounter:
    """Counts words and punctuation marks; no dependency, same count for every server."""

    name = "words"

    def spans(self, text: str) -> list[tuple[int, int]]:
        return [m.span() for m in _WORD.finditer(text)]


class TokenizerJsonCounter:
    """Counts with a Hugging Face tokenizer.json (the `tokenizers` library), without special tokens."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer  # optional: only when the user points at a tokenizer.json

        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer {str(path)!r}: no such file; give a tokenizer.json or its folder")
        self._tokenizer = Tokenizer.from_file(str(path))
        self.name = str(path)

    def spans(self, text: str) -> list[tuple[int, int]]:
        offsets = self._tokenizer.encode(text, add_special_tokens=False).offsets
        return [(start, end) for start, end in offsets if end > start]


def make_counter(tokenizer: str | None) -> TokenCounter:
    return TokenizerJsonCounter(tokenizer) if tokenizer else WordCounter()


def count_tokens(counter: TokenCounter, text: str) -> int:
    return len(counter.spans(text))
