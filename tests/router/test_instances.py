"""Pool.pick: least outstanding tokens, unless an instance holding the longest shared prefix is within the
balance threshold of the least loaded."""
from __future__ import annotations

from jido.router.affinity import prefix_hashes
from jido.router.instances import Instance, Pool

CHUNK = 4


def _pool(loads: list[int], balance_threshold: int = 100) -> Pool:
    instances = [Instance(f"http://h{k}", "decode", healthy=True, outstanding_tokens=n) for k, n in enumerate(loads)]
    return Pool(instances, balance_threshold)


def _picked(pool: Pool, text: str) -> tuple[str | None, str]:
    instance, why = pool.pick(prefix_hashes(text, CHUNK))
    return (instance.url if instance else None), why


def test_the_instance_sent_the_longest_shared_prefix_wins_within_the_threshold():
    pool = _pool([0, 0, 0])
    h0, h1, h2 = pool.instances
    pool.start(h1, prefix_hashes("abcd", CHUNK), 0)  # one chunk there
    pool.start(h2, prefix_hashes("abcdefgh", CHUNK), 0)  # two chunks there
    h0.outstanding_tokens, h1.outstanding_tokens, h2.outstanding_tokens = 0, 10, 100
    assert _picked(pool, "abcdefghij") == ("http://h2", "affinity")  # 100 <= 0 + 100
    assert _picked(pool, "abcdxxxx") == ("http://h1", "affinity")  # only h1's one chunk matches
    assert _picked(pool, "zzzz") == ("http://h0", "least_loaded")


def test_a_holder_past_the_threshold_yields_to_the_least_loaded():
    pool = _pool([0, 0])
    h0, h1 = pool.instances
    pool.start(h1, prefix_hashes("abcdefgh", CHUNK), 0)
    h0.outstanding_tokens, h1.outstanding_tokens = 5, 106
    assert _picked(pool, "abcdefgh") == ("http://h0", "least_loaded")  # 106 > 5 + 100


def test_of_two_instances_sent_the_same_prefix_the_less_loaded_wins():
    pool = _pool([0, 0, 0])
    h0, h1, _ = pool.instances
    for instance in (h0, h1):  # h1 got it last, when h0 was too busy, say; both still cache it
        pool.start(instance, prefix_hashes("abcdefgh", CHUNK), 0)
    h0.outstanding_tokens, h1.outstanding_tokens, pool.instances[2].outstanding_tokens = 30, 50, 0
    assert _picked(pool, "abcdefgh") == ("http://h0", "affinity")
    pool.mark_down(h0, "gone")
    assert _picked(pool, "abcdefgh") == ("http://h1", "affinity")  # the other holder still has it
