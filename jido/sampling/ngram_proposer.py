"""NgramProposer: prompt lookup — propose what followed the latest earlier occurrence of the last n tokens."""
from __future__ import annotations

import numpy as np


class NgramIndex:
    """One request's n-grams (n in ``min_n..max_n``), each mapped to where its latest occurrence ended.

    The index covers the n-grams that end before the request's last token, so a lookup of the last n
    tokens finds an *earlier* occurrence. It only ever grows at the end: each call indexes the n-grams that
    ended since the last one, so the work per step is the tokens added, not the context. The tokens
    themselves stay with the caller (the runner's input batch): the index keeps only positions.
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        self._num_indexed = 0  # the n-grams ending at or before this position are in the index

    def propose(self, token_ids: np.ndarray, k: int) -> list[int]:
        """``k`` tokens that followed the latest earlier match of the longest matching suffix of ``token_ids``.

        ``token_ids`` is every known token of the request (prompt and output), the same sequence, grown
        at the end, on every call. A match that ends ``d`` tokens before the end says the sequence repeats
        with period ``d`` from there: when fewer than ``k`` tokens follow it, the proposal goes on with the
        period (``a b a b`` proposes ``a b a ...``). No match: no proposal.
        """
        num_tokens = len(token_ids)
        self._index(token_ids, num_tokens - 1)
        for n in range(min(self.max_n, num_tokens - 1), self.min_n - 1, -1):
            end = self._latest[n].get(tuple(token_ids[num_tokens - n:].tolist()))
            if end is not None:
                following = token_ids[end:end + k].tolist()
                return [following[i % len(following)] for i in range(k)]
        return []

    def _index(self, token_ids: np.ndarray, upto: int) -> None:
        """Index the n-grams ending (exclusive) after ``_num_indexed`` up to ``upto``."""
        start = self._num_indexed
        if upto <= start:
            return
        # Only the tokens the new n-grams span are converted: [start - max_n, upto).
        first = max(0, start - self.max_n)
        window = token_ids[first:upto].tolist()
        for end in range(start + 1, upto + 1):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._latest[n][tuple(window[end - n - first:end - first])] = end
        self._num_indexed = upto


class NgramProposer:
    """Prompt-lookup proposals for every running request (vLLM's ``ngram`` method)."""

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max
        self._indexes: dict[str, NgramIndex] = {}

    def propose(self, req_id: str, token_ids: np.ndarray, k: int) -> list[int]:
        """Up to ``k`` proposals to follow ``token_ids`` (all of the request's tokens); none without a match."""
        index = self._indexes.get(req_id)
        if index is None:
            index = self._indexes[req_id] = NgramIndex(self.min_n, self.max_n)
        return index.propose(token_ids, k) if k > 0 else []

    def remove(self, req_id: str) -> None:
        """Forget a request that finished or was preempted (a resumed one is indexed again from its tokens)."""
        self._indexes.pop(req_id, None)
