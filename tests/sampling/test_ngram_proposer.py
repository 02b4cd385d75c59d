"""Prompt lookup: the continuation of the latest earlier occurrence of the longest matching suffix, kept incrementally."""
from __future__ import annotations

import random

import numpy as np

from jido.sampling.ngram_proposer import NgramProposer


def scan_from_scratch(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The rule stated plainly: longest n first, latest earlier occurrence, the k tokens after it, where the
    sequence is taken to go on repeating from the match to the end."""
    for n in range(max_n, min_n - 1, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                extended = list(tokens)
                while len(extended) < start + n + k:
                    extended.append(extended[len(extended) - (len(tokens) - start - n)])
                return extended[start + n:start + n + k]
    return []


def test_the_longest_suffix_with_an_earlier_occurrence_proposes_what_followed_its_latest_one():
    proposer = NgramProposer(1, 3)
    tokens = [1, 2, 3, 4, 1, 2, 3, 9, 9, 1, 2]
    # [9, 1, 2] never occurred before; [1, 2] did, last at 4..5, followed by 3, 9, 9.
    assert proposer.propose("a", np.array(tokens), 3) == [3, 9, 9]
    # Grown by one token, the suffix [1, 2, 3] matches at 4..6: what followed it to the end, then repeating.
    assert proposer.propose("a", np.array(tokens + [3]), 7) == [9, 9, 1, 2, 3, 9, 9]
    assert proposer.propose("b", np.array([5, 6, 7]), 3) == []  # no n-gram repeats
    assert proposer.propose("c", np.array([5, 5]), 3) == [5, 5, 5]  # the suffix itself is no earlier occurrence


def test_proposals_kept_incrementally_equal_a_scan_from_scratch():
    rng = random.Random(0)
    for trial in range(30):
        min_n = rng.randint(1, 3)
        max_n = rng.randint(min_n, 5)
        k = rng.randint(1, 6)
        proposer = NgramProposer(min_n, max_n)
        tokens = [rng.randrange(4) for _ in range(rng.randint(1, 5))]
        for _ in range(60):
            assert proposer.propose("r", np.array(tokens), k) == scan_from_scratch(tokens, min_n, max_n, k), trial
            tokens += [rng.randrange(4) for _ in range(rng.randint(1, 4))]  # a step adds one to K+1 tokens


def test_a_removed_request_is_indexed_again_from_its_tokens():
    proposer = NgramProposer(2, 2)
    assert proposer.propose("a", np.array([1, 2, 3, 1, 2]), 2) == [3, 1]
    proposer.remove("a")
    # Back after preemption with other tokens under the same id: nothing of the old index is left.
    assert proposer.propose("a", np.array([7, 8, 7, 8]), 2) == [7, 8]
    assert proposer.propose("a", np.array([7, 8, 7, 8]), 0) == []
