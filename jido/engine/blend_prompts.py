"""Blend prompts (CacheBlend): a ``kv_blend`` field or a separator turned into token ids and a BlendSpec, and the
chunk prefills that cache each chunk on its own before a blend request needs it."""
from __future__ import annotations

from dataclasses import dataclass, field

from jido.config.cache import check_recompute_ratio
from jido.core.kv_blend import BlendSpec
from jido.core.request import Request
from jido.core.sampling_params import SamplingParams
from jido.models.tokenizer import Tokenizer

Text = str | list[int]


def parse_kv_blend(value: object, question: Text, tokenizer: Tokenizer,
                   default_ratio: float) -> tuple[list[int], BlendSpec]:
    """The prompt ids and spec of a ``kv_blend`` field, ``{"chunks": [...], "recompute_ratio": r}``, asking
    ``question`` after the chunks (texts, or token-id lists without BOS). Raises ValueError saying what is wrong."""
    if not isinstance(value, dict) or "chunks" not in value:
        raise ValueError('kv_blend must be an object like {"chunks": ["document", ...]}')
    unknown = set(value) - {"chunks", "recompute_ratio"}
    if unknown:
        raise ValueError(f"kv_blend: unknown key(s) {sorted(unknown)}; known: ['chunks', 'recompute_ratio']")
    chunks = value["chunks"]
    if not isinstance(chunks, list) or not chunks or not all(_is_text(c) and c for c in chunks):
        raise ValueError("kv_blend.chunks must be a non-empty list of non-empty strings or token-id lists")
    if not _is_text(question):
        raise ValueError("a kv_blend prompt's question ('prompt' or 'prompt_token_ids') must be a string or token ids")
    ratio = check_recompute_ratio(value.get("recompute_ratio", default_ratio))
    return blend_prompt(tokenizer, chunks, question, ratio)


def split_on_separator(text: str, separator: str) -> tuple[list[str], str] | None:
    """``chunk SEP chunk SEP ... SEP question`` as (chunks, question); None when the text has no separator."""
    parts = text.split(separator)
    chunks = [part for part in parts[:-1] if part]
    return (chunks, parts[-1]) if chunks else None


def blend_prompt(tokenizer: Tokenizer, chunks: list[Text], question: Text, ratio: float) -> tuple[list[int], BlendSpec]:
    """Head (the tokens the tokenizer puts first: BOS), each chunk tokenized alone, then the question."""
    head = _special_head(tokenizer, chunks[0] if isinstance(chunks[0], str) else "x")
    ids, ends = list(head), []
    for chunk in chunks:
        ids += _ids(tokenizer, chunk)
        ends.append(len(ids))
    ids += _ids(tokenizer, question)
    return ids, BlendSpec(len(head), tuple(ends), ratio)


def _is_text(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                                                       for t in value))


def _ids(tokenizer: Tokenizer, text: Text) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) if isinstance(text, str) else list(text)


def _special_head(tokenizer: Tokenizer, text: str) -> list[int]:
    full, plain = tokenizer.encode(text), tokenizer.encode(text, add_special_tokens=False)
    return full[:len(full) - len(plain)] if plain and full[len(full) - len(plain):] == plain else []


@dataclass
class _Held:
    requests: list[Request]  # the blend request's children, added to the core once its chunks are cached
    pending: set[str] = field(default_factory=set)  # chunk prefills it waits for


class ChunkWarmups:
    """Prefills of chunks the prefix cache lacks, and the blend requests held back until those are cached.

    A chunk is cached as its standalone prompt (head + chunk) by an internal request that computes it and
    one token; blend requests that need the same chunk share its prefill. Their outputs go to no one.
    """

    PREFIX = "kv-blend-chunk:"

    def __init__(self) -> None:
        self._by_tokens: dict[tuple[int, ...], str] = {}
        self._tokens: dict[str, tuple[int, ...]] = {}
        self._waiters: dict[str, set[str]] = {}  # chunk prefill id -> parents waiting for it
        self._held: dict[str, _Held] = {}
        self._count = 0

    def is_warmup(self, req_id: str) -> bool:
        return req_id.startswith(self.PREFIX)

    def hold(self, parent_id: str, requests: list[Request], missing: list[list[int]]) -> list[Request]:
        """Hold ``requests`` until the chunk prompts ``missing`` are cached; returns the prefills to start."""
        started = []
        held = self._held[parent_id] = _Held(requests)
        for tokens in missing:
            key = tuple(tokens)
            warm_id = self._by_tokens.get(key)
            if warm_id is None:
                warm_id = f"{self.PREFIX}{self._count}"
                self._count += 1
                self._by_tokens[key], self._tokens[warm_id] = warm_id, key
                started.append(Request(warm_id, tokens, SamplingParams(max_tokens=1, temperature=0),
                                       arrival_time=requests[0].arrival_time))
            self._waiters.setdefault(warm_id, set()).add(parent_id)
            held.pending.add(warm_id)
        return started

    def finished(self, warm_id: str) -> list[Request]:
        """A chunk prefill ended: the requests of the parents that waited only for it."""
        del self._by_tokens[self._tokens.pop(warm_id)]
        ready = []
        for parent_id in self._waiters.pop(warm_id, set()):
            held = self._held[parent_id]
            held.pending.discard(warm_id)
            if not held.pending:
                ready += self._held.pop(parent_id).requests
        return ready

    def abort(self, parent_id: str) -> list[str]:
        """Forget a held parent; returns the chunk prefills no one waits for any more."""
        held = self._held.pop(parent_id, None)
        orphans = []
        for warm_id in held.pending if held is not None else ():
            waiters = self._waiters[warm_id]
            waiters.discard(parent_id)
            if not waiters:
                del self._waiters[warm_id]
                del self._by_tokens[self._tokens.pop(warm_id)]
                orphans.append(warm_id)
        return orphans
