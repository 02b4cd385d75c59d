"""Data parallelism: the routing policies' choices, and two replicas behind one server serving the
single-process tokens, prompts with a shared prefix landing on the replica that caches it."""
from __future__ import annotations

import json

import pytest

from parallel_prompts import GREEDY
from jido import LLM
from jido.config import EngineConfig
from jido.core.routing import CacheAwareRouter, RoundRobinRouter
from jido.engine.llm_engine import LLMEngine
from server_harness import running_server

BLOCK = 4


def test_a_shared_prefix_goes_where_it_went_before_and_a_new_one_to_the_least_loaded():
    router = CacheAwareRouter(block_size=BLOCK, capacity_blocks=100)
    prefix = list(range(10, 18))  # two full blocks
    assert router.route(prefix + [1], loads=[0, 0]) == 0
    assert router.route(list(range(50, 59)), loads=[1, 0]) == 1  # no match: least loaded
    assert router.route(prefix + [2, 3], loads=[2, 1]) == 0  # two blocks cached there, loads close
    assert router.route(prefix[:4] + [9, 9, 9, 9], loads=[3, 1]) == 0  # one block matches


def test_the_replica_holding_the_longest_prefix_wins_and_equal_matches_go_to_the_less_loaded():
    router = CacheAwareRouter(block_size=BLOCK, capacity_blocks=100)
    prompt = list(range(12))  # three full blocks
    assert router.route(prompt[:4], loads=[1, 0, 1]) == 1  # nothing cached: least loaded
    assert router.route(prompt[:8], loads=[9, 9, 0]) == 2  # 9 over 0: balance wins; replica 2 now has 2 blocks
    assert router.route(prompt, loads=[0, 3, 4]) == 2  # 2 blocks there against 1 on replica 1
    assert router.route(prompt[:4] + [99] * 4, loads=[0, 4, 3]) == 2  # 1 block on both 1 and 2: the less loaded


def test_uneven_loads_override_prefix_affinity():
    router = CacheAwareRouter(block_size=BLOCK, capacity_blocks=100, balance_abs=2, balance_rel=1.5)
    prompt = list(range(8))
    router.route(prompt, loads=[0, 0])
    assert router.route(prompt, loads=[3, 2]) == 0  # within the thresholds: affinity wins over load
    assert router.route(prompt, loads=[5, 1]) == 1  # 4 more and over 1.5x: balance wins


def test_the_oldest_blocks_are_forgotten_past_capacity():
    router = CacheAwareRouter(block_size=BLOCK, capacity_blocks=2)
    first, second = list(range(8)), list(range(100, 108))
    router.route(first, loads=[0, 0])
    router.route(second, loads=[0, 1])  # replica 0 again (least loaded on ties: lowest index); evicts `first`
    assert router.route(first, loads=[1, 0]) == 1  # forgotten on replica 0: the least loaded takes it
    assert router.route(second, loads=[1, 0]) == 0  # still remembered there


def test_round_robin_ignores_the_prompt():
    router = RoundRobinRouter(3)
    assert [router.route([1, 2, 3], [0, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]


def test_offline_llm_refuses_data_parallel_naming_the_server(family_folder):
    with pytest.raises(ValueError, match="data_parallel_size applies to `jido serve`"):
        LLM(str(family_folder("gemma3")), data_parallel_size=2)


def test_two_replicas_serve_the_single_process_tokens_and_keep_a_prefix_on_one(family_folder):
    folder = str(family_folder("gemma3"))
    prefix = [2] + list(range(10, 26))  # four full blocks of 4 and one token
    prompts = [prefix + [40, 41], prefix + [60], [2, 90, 91]]
    expected = [o.outputs[0].text for o in LLM(folder, dtype="float32", kv_cache_memory="4MiB", block_size=BLOCK)
                .generate(prompts, GREEDY, use_tqdm=False)]
    config = EngineConfig.from_kwargs(model=folder, dtype="float32", kv_cache_memory="4MiB", block_size=BLOCK,
                                      data_parallel_size=2)
    replicas = [LLMEngine(config) for _ in range(2)]
    try:
        with running_server(engine=replicas) as server:
            texts = []
            for prompt in prompts:
                status, _, body = server.request("POST", "/v1/completions", {
                    "prompt": prompt, "max_tokens": GREEDY.max_tokens, "temperature": 0})
                assert status == 200
                texts.append(json.loads(body)["choices"][0]["text"])
            hits = server.metrics().total("vllm:prefix_cache_hits")
            assert server.request("GET", "/health")[0] == 200
            # The replicas together hold 2 * (128 running + 256 waiting) sequences: one more can never be admitted.
            status, _, body = server.request("POST", "/v1/completions", {"prompt": [[2, 5]] * 769, "max_tokens": 1})
            assert (status, json.loads(body)["error"]["param"]) == (400, "prompt")
        assert texts == expected
        assert hits == 16  # the second prompt found the first's four blocks on the same replica
        assert [llm.get_scheduler_stats().prefix_cache_hits for llm in replicas] == [16, 0]
    finally:
        for llm in replicas:
            llm.shutdown()
