"""Token counting for prompt lengths: a tokenizer.json, the server's own /tokenize, or words as a fallback."""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

_WORD = re.compile(r"\w+|[^\w\s]")
_TIMEOUT_S = 60.0


class TokenCounter(Protocol):
    """Splits text into tokens and turns a run of them back into text.

    The bench has no engine tokenizer of its own. ``tokenize(text)`` returns one item per token, whatever
    the item is (character offsets, token ids); ``text_of(text, tokens, start, end)`` is the text of
    ``tokens[start:end]`` of that same ``text``. So prompts are cut from real text at a token count without
    the bench knowing how a token is represented. ``name`` says the unit in the results.
    """

    name: str

    def tokenize(self, text: str) -> Sequence[Any]: ...

    def text_of(self, text: str, tokens: Sequence[Any], start: int, end: int) -> str: ...


class _SpanCounter:
    """A counter whose tokens are (start, end) character offsets into the text."""

    def spans(self, text: str) -> list[tuple[int, int]]:
        raise NotImplementedError

    def tokenize(self, text: str) -> list[tuple[int, int]]:
        return self.spans(text)

    def text_of(self, text: str, tokens: Sequence[tuple[int, int]], start: int, end: int) -> str:
        return text[tokens[start][0]:tokens[end - 1][1]]


class WordCounter(_SpanCounter):
    """Counts words and punctuation marks: no dependency, same count for every server, within ~25% of BPE."""

    name = "words"

    def spans(self, text: str) -> list[tuple[int, int]]:
        return [m.span() for m in _WORD.finditer(text)]


class TokenizerJsonCounter(_SpanCounter):
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


class ServerTokenizer:
    """Counts in the served model's tokens through vLLM's /tokenize and /detokenize (jido and vLLM serve both).

    Tokens are ids without special tokens; a window of ids becomes text through /detokenize, which the
    server tokenizes back to the same count give or take a token where the window's edges merge.
    """

    name = "model tokens (the server's /tokenize)"

    def __init__(self, base_url: str, model: str | None) -> None:
        self.base_url, self.model = base_url.rstrip("/"), model

    def tokenize(self, text: str) -> list[int]:
        return self._post("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]

    def text_of(self, text: str, tokens: Sequence[int], start: int, end: int) -> str:
        return self._post("/detokenize", {"tokens": list(tokens[start:end])})["prompt"]

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps({"model": self.model, **body} if self.model else body).encode()
        request = urllib.request.Request(self.base_url + path, data=data,
                                         headers={"Content-Type": "application/json"})
        # No proxies, as the load itself (aiohttp with trust_env=False): the server is the one at base_url.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=_TIMEOUT_S) as response:
            return json.loads(response.read())


def server_tokenizer(base_url: str, model: str | None) -> ServerTokenizer | None:
    """A ServerTokenizer when the server answers /tokenize and /detokenize as vLLM does, else None."""
    counter = ServerTokenizer(base_url, model)
    try:
        ids = counter.tokenize("Hello, world")
        ok = (isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)
              and isinstance(counter.text_of("", ids, 0, len(ids)), str))
    except (OSError, ValueError, KeyError, TypeError):  # urllib's errors are OSErrors
        return None
    return counter if ok else None


def make_counter(tokenizer: str | None, base_url: str | None = None, model: str | None = None) -> TokenCounter:
    """--tokenizer's tokenizer.json when given; else the server's /tokenize when it has one; else words."""
    if tokenizer:
        return TokenizerJsonCounter(tokenizer)
    return (server_tokenizer(base_url, model) if base_url else None) or WordCounter()


def count_tokens(counter: TokenCounter, text: str) -> int:
    return len(counter.tokenize(text))
