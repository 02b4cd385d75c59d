"""Offload tiers through the engine (tiny model, a device pool too small to keep every prompt): evicted prefixes
come back from CPU, disk or a real Redis with the greedy tokens of a run that never evicted; every fault
(Redis down, slow, full; a corrupt entry; a full disk) costs a recompute, a warning and an error count."""
from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import torch
from redis_server import redis_server
from tiny_model_folder import BOS_ID, VOCAB_SIZE, write_tiny_model_folder

from jido import LLM, SamplingParams
from jido.metrics.stats import KVTierStats

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
# 48 blocks of 4 tokens in 3 one-layer groups: one prompt fits, the next evicts most of the one before.
SMALL_POOL = dict(dtype="float32", kv_cache_memory="24KiB", block_size=4, max_num_seqs=1)


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [[BOS_ID, *torch.randint(3, VOCAB_SIZE, (n,), generator=gen).tolist()] for n in (30, 41, 35, 50)]


@pytest.fixture(scope="module")
def reference(tiny_model_folder) -> list[list[int]]:
    llm = LLM(str(tiny_model_folder), dtype="float32", kv_cache_memory="1MiB", block_size=4)
    return [o.outputs[0].token_ids for o in llm.generate(_prompts(), GREEDY, use_tqdm=False)]


def _run(llm: LLM, prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Each prompt alone, in order: token ids and cached tokens per prompt."""
    outputs = [llm.generate([p], GREEDY, use_tqdm=False)[0] for p in prompts]
    return [o.outputs[0].token_ids for o in outputs], [o.num_cached_tokens for o in outputs]


def _tier(llm: LLM, name: str) -> KVTierStats:
    return next(t for t in llm.llm_engine.get_scheduler_stats().kv_connector if t.tier == name)


def _flush(worker) -> None:
    worker.runner.kv_connector.flush()


def _flush_writes(llm: LLM) -> None:
    """Wait for the background writes of the steps so far (the test then changes what they wrote)."""
    llm.collective_rpc(_flush)


def _offload_llm(folder: Path, **kv_offload) -> LLM:
    return LLM(str(folder), **SMALL_POOL, kv_offload=kv_offload)


@pytest.mark.parametrize("codec", ["raw", "int8", "cachegen"])
def test_cpu_tier_brings_evicted_prefixes_back_with_the_same_greedy_tokens(tiny_model_folder, reference, codec):
    llm = _offload_llm(tiny_model_folder, cpu={"size": "1MiB", "codec": codec})
    first, cached_first = _run(llm, _prompts())
    second, cached_second = _run(llm, _prompts())
    assert first == second == reference and cached_first == [0, 0, 0, 0]
    # Everything but each prompt's last partial block, whose hit must leave a token to compute.
    assert cached_second == [28, 40, 32, 48]
    cpu = _tier(llm, "cpu")
    assert cpu.loaded_blocks > 0 and cpu.hits > 0 and cpu.errors == 0 and cpu.stored_blocks > 0
    if codec == "raw":
        assert cpu.loaded_bytes == cpu.loaded_blocks * 4 * 2 * 16 * 4  # one layer, K and V, head_dim 16, float32


def test_disk_tier_keeps_what_a_small_cpu_tier_pushes_out(tiny_model_folder, reference, tmp_path):
    llm = _offload_llm(tiny_model_folder, cpu="4KiB", disk={"path": str(tmp_path), "size": "1MiB"})
    _run(llm, _prompts())
    tokens, cached = _run(llm, _prompts())
    assert tokens == reference and cached[0] == 28
    cpu, disk = _tier(llm, "cpu"), _tier(llm, "disk")
    assert cpu.used_bytes <= 4096 and disk.loaded_blocks > 0 and disk.used_bytes > 0
    _flush_writes(llm)
    assert len(list(tmp_path.glob("*/*"))) == disk.used_bytes // (cpu.stored_bytes // cpu.stored_blocks)


def test_a_corrupt_disk_entry_is_dropped_and_its_tokens_recomputed(tiny_model_folder, reference, tmp_path, caplog):
    llm = _offload_llm(tiny_model_folder, disk={"path": str(tmp_path), "size": "1MiB"})
    _run(llm, _prompts())
    _flush_writes(llm)
    corrupted = {}
    for path in sorted(tmp_path.glob("*/*")):  # flip one payload bit of every entry
        data = bytearray(path.read_bytes())
        data[-1] ^= 1
        corrupted[path] = bytes(data)
        path.write_bytes(corrupted[path])
    with caplog.at_level(logging.WARNING, logger="jido"):
        tokens, cached = _run(llm, _prompts()[:1])
    assert tokens == reference[:1] and cached == [0]
    assert _tier(llm, "disk").errors == 1 and "checksum mismatch" in caplog.text
    _flush_writes(llm)
    # The one read was deleted, then saved again, intact, as its recomputed block was released.
    assert [path.read_bytes() != data for path, data in corrupted.items()].count(True) == 1


def test_a_full_disk_disables_the_tier_with_a_warning(tiny_model_folder, reference, tmp_path, monkeypatch, caplog):
    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr("jido.offload.stores.write_file", full)
    llm = _offload_llm(tiny_model_folder, disk={"path": str(tmp_path), "size": "1MiB"})
    with caplog.at_level(logging.WARNING, logger="jido"):
        first, _ = _run(llm, _prompts())
        second, cached = _run(llm, _prompts())
    assert first == second == reference and cached[:3] == [0, 0, 0]
    disk = _tier(llm, "disk")
    assert not disk.enabled and disk.stored_blocks == 0 and "tier disk disabled: disk full" in caplog.text


def test_two_engines_sharing_redis_reuse_each_others_prefixes(tiny_model_folder, reference, tmp_path):
    with redis_server(tmp_path) as redis:
        first = _offload_llm(tiny_model_folder, remote=redis.url)
        _run(first, _prompts())
        # Writes that end after a step are reported by the one after it: wait for the writes, then step.
        _flush_writes(first)
        first.llm_engine.step()
        assert len(redis.client().keys("jido:kv:*")) == _tier(first, "remote").stored_blocks > 0
        first.shutdown()
        second = _offload_llm(tiny_model_folder, remote=redis.url)
        tokens, cached = _run(second, _prompts()[:1])
        assert tokens == reference[:1] and cached == [28]  # a prompt only the first engine has seen
        assert _tier(second, "remote").loaded_blocks > 0


@pytest.fixture(scope="module")
def hybrid_model_folder(tmp_path_factory) -> Path:
    """Gemma 3's layer pattern in small: five sliding-window layers (8 tokens, two blocks) and one full one."""
    return write_tiny_model_folder(tmp_path_factory.mktemp("tiny-hybrid"), num_hidden_layers=6, sliding_window=8,
                                   layer_types=["sliding_attention"] * 5 + ["full_attention"])


def _hybrid_prompt() -> list[int]:
    gen = torch.Generator().manual_seed(1)
    return [BOS_ID, *torch.randint(3, VOCAB_SIZE, (60,), generator=gen).tolist()]


def _hybrid_llm(folder: Path, **kv_offload) -> LLM:
    # 128 blocks: a prompt holds 17 in the full group, 3 in each sliding one.
    return LLM(str(folder), **{**SMALL_POOL, "kv_cache_memory": "64KiB"}, kv_offload=kv_offload)


def _assert_prefix_loaded(llm: LLM, tier: str, prompt: list[int], tokens: list[int]) -> None:
    """The prompt's 15 whole blocks before its last token came from ``tier``: the full group's 15, and of each of
    the 5 sliding groups the 2 the query at token 60 sees (53..59); the greedy tokens are the first run's."""
    assert _run(llm, [prompt]) == ([tokens], [60])
    stats = _tier(llm, tier)
    assert (stats.hits, stats.misses, stats.loaded_blocks, stats.errors) == (15, 0, 15 + 5 * 2, 0)


def test_a_fresh_engine_loads_a_hybrid_models_prefix_from_redis(hybrid_model_folder, tmp_path):
    prompt = _hybrid_prompt()
    with redis_server(tmp_path) as redis:
        first = _hybrid_llm(hybrid_model_folder, remote=redis.url)
        (tokens,), _ = _run(first, [prompt])
        # generate() returns once the blocks its request released are handed to the writer: no later step needed.
        _flush_writes(first)
        second = _hybrid_llm(hybrid_model_folder, remote=redis.url)
        _assert_prefix_loaded(second, "remote", prompt, tokens)
        _flush_writes(second)
        second.llm_engine.step()  # reports the writes
        # Written back: block 15 (tokens 60..63, computed here) in each of the 6 groups; none of the 25 it loaded.
        assert _tier(second, "remote").stored_blocks == 6
        first.shutdown()
        second.shutdown()


def test_a_restarted_engine_loads_a_hybrid_models_prefix_from_its_disk_tier(hybrid_model_folder, tmp_path):
    prompt, disk = _hybrid_prompt(), {"path": str(tmp_path), "size": "1MiB"}
    first = _hybrid_llm(hybrid_model_folder, disk=disk)
    (tokens,), _ = _run(first, [prompt])
    first.shutdown()
    _assert_prefix_loaded(_hybrid_llm(hybrid_model_folder, disk=disk), "disk", prompt, tokens)


def test_a_corrupt_redis_entry_is_dropped_and_recomputed(tiny_model_folder, reference, tmp_path, caplog):
    with redis_server(tmp_path) as redis:
        first = _offload_llm(tiny_model_folder, remote=redis.url)
        _run(first, _prompts())
        first.shutdown()
        client = redis.client()
        for key in client.keys("jido:kv:*"):
            client.setrange(key, client.strlen(key) - 1, b"\xff")
        second = _offload_llm(tiny_model_folder, remote=redis.url)
        with caplog.at_level(logging.WARNING, logger="jido"):
            tokens, cached = _run(second, _prompts()[:1])
        assert tokens == reference[:1] and cached == [0] and "checksum mismatch" in caplog.text
        assert _tier(second, "remote").errors == 1
        second.shutdown()
        # Its recomputed blocks were written over the corrupt entries as they were released: a third engine loads them.
        third = _offload_llm(tiny_model_folder, remote=redis.url)
        assert _run(third, _prompts()[:1]) == (reference[:1], [28]) and _tier(third, "remote").errors == 0


def test_redis_down_is_a_miss_with_a_warning_and_an_error_count(tiny_model_folder, reference, tmp_path, caplog):
    with redis_server(tmp_path) as redis:
        url = redis.url  # a port nobody listens on once the server is gone
    llm = _offload_llm(tiny_model_folder, remote={"url": url, "timeout_s": 0.2})
    with caplog.at_level(logging.WARNING, logger="jido"):
        first, _ = _run(llm, _prompts())
        second, _ = _run(llm, _prompts())
    assert first == second == reference
    assert _tier(llm, "remote").errors > 0 and "KV offload tier remote" in caplog.text


def test_slow_redis_times_out_into_a_recompute(tiny_model_folder, reference, tmp_path, caplog):
    with redis_server(tmp_path) as redis:
        llm = _offload_llm(tiny_model_folder, remote={"url": redis.url, "timeout_s": 0.2})
        _run(llm, _prompts())
        redis.client().execute_command("CLIENT", "PAUSE", "3000", "ALL")  # every command waits 3 s
        with caplog.at_level(logging.WARNING, logger="jido"):
            tokens, cached = _run(llm, _prompts()[:1])
        assert tokens == reference[:1] and cached == [0]
        assert _tier(llm, "remote").errors >= 1 and "Timeout" in caplog.text


def test_full_redis_refuses_writes_and_every_request_still_succeeds(tiny_model_folder, reference, tmp_path, caplog):
    with redis_server(tmp_path, "--maxmemory-policy", "noeviction") as redis:
        redis.client().config_set("maxmemory", 1)  # below what an empty server uses: every write is refused
        llm = _offload_llm(tiny_model_folder, remote=redis.url)
        with caplog.at_level(logging.WARNING, logger="jido"):
            first, _ = _run(llm, _prompts())
            second, cached = _run(llm, _prompts())
        assert first == second == reference and cached[:3] == [0, 0, 0]
        remote = _tier(llm, "remote")
        assert remote.stored_blocks == 0 and remote.errors > 0 and "maxmemory" in caplog.text


def test_cpu_tier_works_across_the_worker_process_boundary(tiny_model_folder, reference):
    llm = LLM(str(tiny_model_folder), **SMALL_POOL, kv_offload={"cpu": "1MiB"}, distributed_executor_backend="mp")
    try:
        _run(llm, _prompts())
        tokens, cached = _run(llm, _prompts())
    finally:
        llm.shutdown()
    assert tokens == reference and cached == [28, 40, 32, 48]


def _record_layer_hooks(worker) -> None:
    connector, calls = worker.runner.kv_connector, []
    connector.wait_for_layer_load = lambda layer: calls.append(("load", layer))
    connector.save_kv_layer = lambda layer, kv_cache, metadata: calls.append(("save", layer))
    connector.calls = calls


def _recorded(worker) -> list:
    return worker.runner.kv_connector.calls


def test_the_worker_connector_hears_each_layer_of_each_step_in_order(tiny_model_folder):
    llm = _offload_llm(tiny_model_folder, cpu="1MiB")
    llm.collective_rpc(_record_layer_hooks)
    llm.generate([[BOS_ID, 5, 6, 7]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    per_step = [("load", 0), ("save", 0), ("load", 1), ("save", 1), ("load", 2), ("save", 2)]
    assert llm.collective_rpc(_recorded)[0] == per_step * 2  # the prompt's step, then one decode step


def test_swap_preemption_brings_preempted_requests_back_from_the_cpu_tier(tiny_model_folder):
    prompts = [[BOS_ID, *torch.randint(3, VOCAB_SIZE, (20,), generator=torch.Generator().manual_seed(s)).tolist()]
               for s in range(4)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    reference = LLM(str(tiny_model_folder), dtype="float32", kv_cache_memory="1MiB", block_size=4)
    expected = [o.outputs[0].token_ids for o in reference.generate(prompts, params, use_tqdm=False)]
    # Four requests of 60 tokens in 48 blocks of three groups: they preempt each other as they grow.
    llm = LLM(str(tiny_model_folder), dtype="float32", kv_cache_memory="24KiB", block_size=4, max_num_seqs=4,
              preemption_mode="swap")
    assert llm.llm_engine.config.kv_offload.tiers[0].size_bytes == 4 * 2**30  # vLLM's default swap space
    tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    stats = llm.llm_engine.get_scheduler_stats()
    assert tokens == expected and stats.num_preemptions > 0 and stats.kv_connector[0].loaded_blocks > 0


def test_swap_needs_a_cpu_tier_to_swap_to(tiny_model_folder, tmp_path):
    with pytest.raises(ValueError, match="preemption_mode='swap' swaps to kv_offload's cpu tier"):
        LLM(str(tiny_model_folder), preemption_mode="swap", kv_offload={"disk": {"path": str(tmp_path), "size": "1MiB"}})


def test_offload_without_prefix_caching_is_refused_before_the_model_loads(tiny_model_folder):
    with pytest.raises(ValueError, match="kv_offload keeps the blocks the prefix cache evicts: it needs "
                                         "enable_prefix_caching"):
        LLM(str(tiny_model_folder), kv_offload={"cpu": "1MiB"}, enable_prefix_caching=False)
