"""Prefill/decode disaggregation through two engines in one process (tiny model, float32): a consumer that loads a
producer's KV decodes the greedy tokens of a co-located run, over every transport, pulled and pushed; every fault
(stall past the timeout, a freed handle, a lease nobody claims, no room, another block size) ends in a local
prefill with the same tokens, and both sides' blocks are freed."""
from __future__ import annotations

import time

import pytest
import torch
from tiny_model_folder import BOS_ID, VOCAB_SIZE

from jido.config import EngineConfig
from jido.core.sampling_params import SamplingParams
from jido.engine.llm_engine import LLMEngine
from jido.engine.outputs import RequestOutput
from jido.metrics.stats import KVTransferStats

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
FIRST_TOKEN = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
COMMON = dict(dtype="float32", kv_cache_memory="512KiB", block_size=4)


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [[BOS_ID, *torch.randint(3, VOCAB_SIZE, (n,), generator=gen).tolist()] for n in (30, 41, 9)]


_OPEN: list[LLMEngine] = []


@pytest.fixture(autouse=True)
def _shut_engines_down():
    """Every engine a test made stops its KV endpoint and threads afterwards (and frees its cache)."""
    yield
    while _OPEN:
        _OPEN.pop().shutdown()


def _engine(folder, role: str | None = None, **transfer) -> LLMEngine:
    engine_kwargs = {k: transfer.pop(k) for k in list(transfer) if k in ("block_size", "kv_cache_memory",
                                                                        "kv_cache_dtype", "max_num_seqs")}
    kwargs = {**COMMON, **engine_kwargs}
    if role is not None:
        kwargs["kv_transfer_config"] = {"kv_connector": "tcp", "kv_role": role, "kv_port": 0, **transfer}
    engine = LLMEngine(EngineConfig.from_kwargs(model=str(folder), **kwargs))
    _OPEN.append(engine)
    return engine


def _run(engine: LLMEngine, req_id: str, prompt: list[int], params: SamplingParams, kv: dict | None = None,
         also: LLMEngine | None = None) -> RequestOutput:
    """Step ``engine`` (and ``also``, a producer answering pulls) until the request is done."""
    engine.add_request(req_id, prompt, params, kv_transfer_params=kv)
    output, deadline = None, time.monotonic() + 120
    while engine.has_unfinished_requests():
        for delta in engine.step():
            output = delta if output is None else (output.add(delta) or output)
        if also is not None and also.has_engine_work():
            also.step()
        assert time.monotonic() < deadline, "the request did not finish"
    return output


def _settle(engine: LLMEngine, timeout_s: float = 10.0) -> None:
    """Step until the engine holds nothing for anyone (its exports released, expired or pushed)."""
    deadline = time.monotonic() + timeout_s
    while engine.has_engine_work():
        engine.step()
        assert time.monotonic() < deadline, "the engine still holds KV"


def _stats(engine: LLMEngine) -> KVTransferStats:
    return engine.get_scheduler_stats().kv_connector[0]


def _push_to(consumer: LLMEngine) -> dict:
    host, port = consumer.kv_connector_info["address"].removeprefix("tcp://").split(":")
    return {"remote_host": host, "remote_port": int(port)}


@pytest.fixture(scope="module")
def reference(tiny_model_folder) -> list[list[int]]:
    engine = _engine(tiny_model_folder)
    return [_run(engine, f"ref-{i}", p, GREEDY).outputs[0].token_ids for i, p in enumerate(_prompts())]


def _handoff(producer: LLMEngine, consumer: LLMEngine, prompts: list[list[int]], push: bool = False,
             tag: str = "") -> tuple[list[list[int]], list[RequestOutput]]:
    tokens, first = [], []
    for i, prompt in enumerate(prompts):
        ask = {"do_remote_decode": True, **(_push_to(consumer) if push else {})}
        prefilled = _run(producer, f"p{tag}{i}", prompt, FIRST_TOKEN, ask)
        first.append(prefilled)
        out = _run(consumer, f"c{tag}{i}", prompt, GREEDY, prefilled.kv_transfer_params, also=producer)
        tokens.append(out.outputs[0].token_ids)
    return tokens, first


@pytest.mark.parametrize("transport, mode, layerwise", [("tcp", "pull", True), ("shm", "pull", True),
                                                         ("tcp", "push", True), ("shm", "push", True),
                                                         ("tcp", "push", False)])
def test_consumer_decodes_the_producers_kv_with_the_colocated_greedy_tokens(tiny_model_folder, reference, transport,
                                                                          mode, layerwise):
    settings = dict(kv_connector=transport, kv_mode=mode, kv_layerwise=layerwise)
    producer, consumer = _engine(tiny_model_folder, "kv_producer", **settings), _engine(tiny_model_folder, "kv_consumer", **settings)
    tokens, prefilled = _handoff(producer, consumer, _prompts(), push=mode == "push")
    assert tokens == reference
    assert [p.outputs[0].token_ids for p in prefilled] == [r[:1] for r in reference]
    handle = prefilled[0].kv_transfer_params
    assert handle["do_remote_prefill"] and handle["num_tokens"] == 31 and handle["transport"] == transport
    assert handle["format"]["cache_dtype"] == "float32" and handle["format"]["block_size"] == 4
    _settle(producer)
    sent, received = _stats(producer), _stats(consumer)
    assert received.received == 3 and received.failed == 0 and sent.held == 0
    # Every prompt token but the last: its KV travels, raw float32 (3 one-layer groups, K and V, head_dim 16).
    needed_tokens = sum(-(-(len(p) - 1) // 4) * 4 for p in _prompts())
    assert received.received_bytes == sent.sent_bytes > 0
    assert received.received_bytes <= needed_tokens * 3 * 2 * 16 * 4
    assert producer.core.scheduler.kv.usage == consumer.core.scheduler.kv.usage == 0.0


def test_handle_reports_where_the_kv_lives_and_what_it_is(tiny_model_folder):
    producer = _engine(tiny_model_folder, "kv_producer", kv_lease_s=30.0)
    prompt = _prompts()[0]
    handle = _run(producer, "p", prompt, FIRST_TOKEN, {"do_remote_decode": True}).kv_transfer_params
    assert handle["residency"] == "producer" and handle["owner"] == "producer" and handle["mode"] == "pull"
    assert handle["producer"] == producer.kv_connector_info["address"]
    assert len(handle["block_hashes"]) == len(prompt) // 4 and time.time() < handle["lease_expires"] <= time.time() + 30
    assert handle["format"]["scales"] == "none" and handle["format"]["groups"] == [[1], [0], [2]]
    assert producer.core.scheduler.held  # its blocks wait for a consumer


def test_consumer_with_a_cached_prefix_pulls_only_the_rest(tiny_model_folder, reference):
    producer, consumer = _engine(tiny_model_folder, "kv_producer"), _engine(tiny_model_folder, "kv_consumer")
    long_prompt = _prompts()[1]
    _run(consumer, "warm", long_prompt[:25], GREEDY)  # 6 full blocks of the prompt now cached on the consumer
    tokens, _ = _handoff(producer, consumer, [long_prompt])
    assert tokens == [reference[1]]
    # 41 tokens to load (positions 0..10); the consumer had blocks 0..5 and pulled 6..10 of the full group
    # (the sliding groups, window 4, only the last one or two).
    received = _stats(consumer)
    assert received.received_tokens == 5 * 4


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_producer_with_a_cached_prefix_hands_over_the_hit_blocks_too(tiny_model_folder, reference, mode):
    producer = _engine(tiny_model_folder, "kv_producer", kv_mode=mode)
    consumer = _engine(tiny_model_folder, "kv_consumer", kv_mode=mode)
    long_prompt = _prompts()[1]
    _run(producer, "warm", long_prompt[:30], GREEDY)  # the producer computes only what follows its 28 cached tokens
    tokens, prefilled = _handoff(producer, consumer, [long_prompt], push=mode == "push")
    assert tokens == [reference[1]] and prefilled[0].num_cached_tokens == 28
    assert _stats(consumer).received == 1 and _stats(consumer).failed == 0


def test_int8_kv_cache_consumer_quantizes_the_float32_kv_it_receives_as_its_own_prefill_would(tiny_model_folder):
    producer = _engine(tiny_model_folder, "kv_producer")
    consumer = _engine(tiny_model_folder, "kv_consumer", kv_cache_dtype="int8")
    local = _engine(tiny_model_folder, kv_cache_dtype="int8")
    expected = [_run(local, f"l{i}", p, GREEDY).outputs[0].token_ids for i, p in enumerate(_prompts())]
    tokens, _ = _handoff(producer, consumer, _prompts())
    assert tokens == expected and _stats(consumer).failed == 0


@pytest.mark.parametrize("codec, ratio", [("int8", 0.35), ("cachegen", 0.35)])
def test_quantizing_codecs_send_a_fraction_of_the_bytes(tiny_model_folder, reference, codec, ratio):
    producer = _engine(tiny_model_folder, "kv_producer", kv_codec=codec)
    consumer = _engine(tiny_model_folder, "kv_consumer")
    tokens, _ = _handoff(producer, consumer, _prompts())
    received = _stats(consumer)
    assert received.received == 3 and received.failed == 0
    raw = sum(-(-(len(p) - 1) // 4) for p in _prompts()) * 4 * 3 * 2 * 16 * 4  # upper bound of raw bytes
    assert received.received_bytes < ratio * raw
    assert sum(a == b for t, r in zip(tokens, reference) for a, b in zip(t, r)) >= 0.5 * sum(map(len, reference))


def test_stalled_producer_past_the_timeout_costs_a_local_prefill(tiny_model_folder, reference):
    import zmq
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # takes requests and never answers
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    producer = _engine(tiny_model_folder, "kv_producer")
    consumer = _engine(tiny_model_folder, "kv_consumer", kv_transfer_timeout_s=0.5)
    prompt = _prompts()[0]
    handle = _run(producer, "p", prompt, FIRST_TOKEN, {"do_remote_decode": True}).kv_transfer_params
    stalled = {**handle, "producer": f"tcp://127.0.0.1:{port}"}
    start = time.monotonic()
    out = _run(consumer, "c", prompt, GREEDY, stalled)
    assert out.outputs[0].token_ids == reference[0] and time.monotonic() - start < 10
    assert _stats(consumer).failed == 1 and out.num_cached_tokens == 0
    assert consumer.core.scheduler.kv.usage == 0.0
    silent.close()


def test_handle_for_kv_already_freed_is_refused_and_the_consumer_prefills(tiny_model_folder, reference):
    producer, consumer = _engine(tiny_model_folder, "kv_producer"), _engine(tiny_model_folder, "kv_consumer")
    prompt = _prompts()[0]
    handle = _run(producer, "p", prompt, FIRST_TOKEN, {"do_remote_decode": True}).kv_transfer_params
    first = _run(consumer, "c1", prompt, GREEDY, handle, also=producer)
    consumer.reset_prefix_cache()
    again = _run(consumer, "c2", prompt, GREEDY, handle, also=producer)  # released after the first load
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == reference[0]
    assert first.num_cached_tokens == len(prompt) - 1 and again.num_cached_tokens == 0
    assert _stats(consumer).failed == 1 and _stats(consumer).received == 1


def test_producer_frees_kv_nobody_fetched_when_its_lease_ends(tiny_model_folder):
    producer = _engine(tiny_model_folder, "kv_producer", kv_lease_s=0.3)
    _run(producer, "p", _prompts()[0], FIRST_TOKEN, {"do_remote_decode": True})
    assert producer.core.scheduler.kv.usage > 0
    _settle(producer)
    assert _stats(producer).expired == 1 and producer.core.scheduler.kv.usage == 0.0


def test_consumer_without_room_waits_then_pulls(tiny_model_folder, reference):
    producer = _engine(tiny_model_folder, "kv_producer")
    # 40 blocks: while the long request decodes, the 24 blocks a 30-token load takes (8 positions in each
    # of 3 groups) are not free.
    consumer = _engine(tiny_model_folder, "kv_consumer", kv_cache_memory="20KiB", max_num_seqs=4)
    long_prompt, short_prompt = _prompts()[1], _prompts()[0]
    handle = _run(producer, "p", short_prompt, FIRST_TOKEN, {"do_remote_decode": True}).kv_transfer_params
    consumer.add_request("busy", long_prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    consumer.step()  # the long request takes the pool
    consumer.add_request("remote", short_prompt, GREEDY, kv_transfer_params=handle)
    outputs: dict[str, RequestOutput] = {}
    waited = False
    deadline = time.monotonic() + 120
    while consumer.has_unfinished_requests():
        waited |= "busy" not in outputs and any(r.request_id == "remote" for r in consumer.core.scheduler.waiting)
        for delta in consumer.step():
            if delta.request_id in outputs:
                outputs[delta.request_id].add(delta)
            else:
                outputs[delta.request_id] = delta
        producer.step()
        assert time.monotonic() < deadline
    assert waited and outputs["remote"].outputs[0].token_ids == reference[0]
    assert outputs["remote"].num_cached_tokens == len(short_prompt) - 1 and _stats(consumer).failed == 0


def test_push_to_a_consumer_without_buffer_room_is_pulled_instead(tiny_model_folder, reference):
    producer = _engine(tiny_model_folder, "kv_producer", kv_mode="push")
    consumer = _engine(tiny_model_folder, "kv_consumer", kv_mode="push", kv_buffer_size="1KiB")
    tokens, _ = _handoff(producer, consumer, _prompts()[:1], push=True)
    assert tokens == reference[:1]
    assert _stats(producer).push_refused == 1 and _stats(consumer).received == 1
    _settle(producer)


def test_another_block_size_is_refused_and_the_consumer_prefills(tiny_model_folder, reference, caplog):
    producer = _engine(tiny_model_folder, "kv_producer", block_size=8)
    consumer = _engine(tiny_model_folder, "kv_consumer")
    prompt = _prompts()[0]
    handle = _run(producer, "p", prompt, FIRST_TOKEN, {"do_remote_decode": True}).kv_transfer_params
    out = _run(consumer, "c", prompt, GREEDY, handle)
    assert out.outputs[0].token_ids == reference[0] and out.num_cached_tokens == 0
    assert "different models" in caplog.text or "block_size differs" in caplog.text


def test_role_checks_reject_requests_the_instance_cannot_serve(tiny_model_folder):
    consumer, plain = _engine(tiny_model_folder, "kv_consumer"), _engine(tiny_model_folder)
    with pytest.raises(ValueError, match="no KV producer"):
        consumer.add_request("x", [BOS_ID, 5], GREEDY, kv_transfer_params={"do_remote_decode": True})
    with pytest.raises(ValueError, match="needs handle_id"):
        consumer.add_request("y", [BOS_ID, 5], GREEDY, kv_transfer_params={"do_remote_prefill": True})
    producer = _engine(tiny_model_folder, "kv_producer")
    with pytest.raises(ValueError, match="needs max_tokens 1 and n 1"):
        producer.add_request("w", [BOS_ID, 5], GREEDY, kv_transfer_params={"do_remote_decode": True})
    with pytest.raises(ValueError, match="needs an engine with a kv_transfer_config"):
        plain.add_request("z", [BOS_ID, 5], GREEDY, kv_transfer_params={"do_remote_decode": True})
