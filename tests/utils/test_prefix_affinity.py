"""PrefixAffinity: per-owner LRU of chained prefix hashes, the longest leading run over candidates, forgetting."""
from __future__ import annotations

import pytest

from jido.utils.prefix_affinity import PrefixAffinity

A, B, C, D = b"a", b"b", b"c", b"d"  # stand-ins for a chain of hashes a <- b <- c <- d


def test_the_candidate_holding_the_longest_leading_run_wins():
    affinity: PrefixAffinity[str] = PrefixAffinity(capacity=10)
    affinity.record([A], "x")
    affinity.record([A, B, C], "y")
    assert affinity.longest_match([A, B, C, D], ["x", "y"]) == ("y", 3)
    assert affinity.longest_match([A, B, C, D], ["x"]) == ("x", 1)  # a non-candidate's longer run is ignored
    assert affinity.longest_match([B, C], ["x", "y"]) == ("y", 2)
    assert affinity.longest_match([D], ["x", "y"]) == (None, 0)
    assert affinity.longest_match([A], ["never-sent"]) == (None, 0)


def test_a_run_stops_at_the_first_hash_the_owner_was_not_sent():
    affinity: PrefixAffinity[int] = PrefixAffinity(capacity=10)
    affinity.record([A, C, D], 0)  # c and d held, b not: only the run before b counts
    assert affinity.matched([A, B, C, D], 0) == 1
    assert affinity.matched([A, B, C, D], 1) == 0


def test_equal_runs_go_to_the_first_candidate_in_the_callers_order():
    affinity: PrefixAffinity[int] = PrefixAffinity(capacity=10)
    affinity.record([A, B], 0)
    affinity.record([A, B], 1)  # a prefix sent to two owners is held by both
    assert affinity.longest_match([A, B], [1, 0]) == (1, 2)
    assert affinity.longest_match([A, B], [0, 1]) == (0, 2)


def test_each_owner_drops_its_least_recently_sent_hashes_past_capacity():
    affinity: PrefixAffinity[int] = PrefixAffinity(capacity=2)
    affinity.record([A, B], 0)
    affinity.record([C], 1)  # another owner's hashes do not count against owner 0's capacity
    affinity.record([A], 0)  # a is now owner 0's most recent, b its oldest
    affinity.record([C], 0)  # evicts b
    assert [affinity.matched(h, 0) for h in ([A], [B], [C])] == [1, 0, 1]
    assert affinity.matched([C], 1) == 1


def test_a_forgotten_owner_holds_nothing():
    affinity: PrefixAffinity[str] = PrefixAffinity(capacity=10)
    affinity.record([A, B], "x")
    affinity.record([A], "y")
    affinity.forget("x")
    affinity.forget("never-sent")
    assert affinity.longest_match([A, B], ["x", "y"]) == ("y", 1)


def test_capacity_below_one_is_refused():
    with pytest.raises(ValueError, match="capacity must be at least 1 hash per owner, got 0"):
        PrefixAffinity(capacity=0)
