"""CacheBlend's records: a prompt made of independently cached chunks, and what the runner blends in one step."""
from __future__ import annotations

from dataclasses import dataclass

from jido.config.cache import check_recompute_ratio

NOT_CACHED = -1  # a source block position the prefix cache does not hold


@dataclass(frozen=True)
class BlendSpec:
    """A prompt made of a head, independently cached chunks (documents) and a question (CacheBlend, EuroSys 2025).

    ``prompt[:prefix_len]`` is the head each chunk was cached after (the BOS token, or a system prompt);
    chunk ``i`` is ``prompt[chunk_ends[i - 1]:chunk_ends[i]]`` (the first starts at ``prefix_len``). What
    follows the last chunk (the question, later the outputs) is always computed. A chunk's KV comes from the
    prefix cache's copy of ``head + chunk``, computed alone, moved to its place in this prompt.
    """

    prefix_len: int
    chunk_ends: tuple[int, ...]
    recompute_ratio: float

    def __post_init__(self) -> None:
        if self.prefix_len < 0 or not self.chunk_ends:
            raise ValueError("kv_blend needs at least one chunk")
        bounds = (self.prefix_len, *self.chunk_ends)
        if any(b <= a for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"kv_blend chunks must be non-empty and in order, got ends {self.chunk_ends} after a "
                             f"head of {self.prefix_len} tokens")
        check_recompute_ratio(self.recompute_ratio)

    def spans(self) -> list[tuple[int, int]]:
        """Each chunk's ``(start, end)`` in the prompt."""
        return list(zip((self.prefix_len, *self.chunk_ends[:-1]), self.chunk_ends))

    def standalone(self, token_ids: list[int], chunk: int) -> list[int]:
        """The prompt chunk ``chunk`` was cached as: the head, then the chunk."""
        start, end = self.spans()[chunk]
        return token_ids[:self.prefix_len] + token_ids[start:end]

    @property
    def num_exact_tokens(self) -> int:
        """Leading positions whose blended KV equals a full prefill's: through the first chunk, which was cached
        after the same head at the same place. Blocks past it are never offered to the prefix cache."""
        return self.chunk_ends[0]


@dataclass(frozen=True)
class BlendChunk:
    """One chunk to blend, for the runner: where its cached KV is and where it goes.

    Token ``j`` of the chunk sits at prompt position ``start + j`` and was cached at position
    ``source_start + j`` of its standalone prompt, in block ``source_block_ids[g][(source_start + j) //
    block_size]`` of group ``g`` (``NOT_CACHED``: that token's KV is computed instead).
    """

    start: int
    source_start: int
    num_tokens: int
    source_block_ids: list[list[int]]


@dataclass(frozen=True)
class BlendPlan:
    """What the runner blends in one request's prefill step: its chunks past the prefix hit, and the share of
    their reused tokens to recompute."""

    chunks: list[BlendChunk]
    recompute_ratio: float
