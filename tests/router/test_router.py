"""The router over real jido servers on 127.0.0.1 (tiny model, float32): greedy answers through router + producer +
consumer equal one co-located server's, streamed or not, for every transport, pulled and pushed; selective
disaggregation, data-parallel prefix affinity, health checks, metrics, and a clear startup error for instances
that cannot exchange KV."""
from __future__ import annotations

import asyncio
import json

import pytest
import torch
from router_harness import router, tiny_server
from server.server_harness import metric, wait_until
from tiny_model_folder import BOS_ID, VOCAB_SIZE

from jido.router.config import RouterConfig
from jido.router.proxy import Router, derive_prefill_threshold


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [[BOS_ID, *torch.randint(3, VOCAB_SIZE, (n,), generator=gen).tolist()] for n in (33, 21, 47)]


def _body(prompt: list[int], **extra) -> dict:
    return {"prompt": prompt, "max_tokens": 7, "temperature": 0, "ignore_eos": True, **extra}


def _complete(server, prompt: list[int], **extra) -> dict:
    status, _, body = server.request("POST", "/v1/completions", _body(prompt, **extra))
    assert status == 200, body
    return json.loads(body)


def _streamed_text(server, prompt: list[int]) -> str:
    status, _, body = server.request("POST", "/v1/completions", _body(prompt, stream=True))
    assert status == 200, body
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"])


@pytest.fixture(scope="module")
def colocated(tiny_model_folder) -> list[str]:
    with tiny_server(tiny_model_folder) as server:
        return [_complete(server, p)["choices"][0]["text"] for p in _prompts()]


@pytest.mark.parametrize("transport, mode", [("tcp", "pull"), ("shm", "pull"), ("tcp", "push"), ("shm", "push")])
def test_router_with_producer_and_consumer_answers_as_one_colocated_server(tiny_model_folder, colocated, transport,
                                                                           mode):
    with tiny_server(tiny_model_folder, "kv_producer", transport, kv_mode=mode) as prefill, \
            tiny_server(tiny_model_folder, "kv_consumer", transport, kv_mode=mode) as decode, \
            router([prefill.base_url], [decode.base_url]) as proxy:
        answers = [_complete(proxy, p) for p in _prompts()]
        assert [a["choices"][0]["text"] for a in answers] == colocated
        assert [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers] == [len(p) - 1 for p in _prompts()]
        decode.serving.llm.reset_prefix_cache()
        assert [_streamed_text(proxy, p) for p in _prompts()] == colocated
        routed = proxy.metrics()
        assert metric(routed, "jido:router_requests_total", decision="disaggregated") == 6
        assert metric(routed, "jido:router_fallbacks_total") == 0
        consumer = decode.metrics()
        assert metric(consumer, "jido:kv_transfers_total", result="received") == 6
        assert metric(consumer, "jido:kv_transfer_bytes_total", direction="received") > 0
        assert metric(consumer, "jido:kv_transfer_time_seconds_count") == 6
        wait_until(lambda: metric(prefill.metrics(), "jido:kv_transfer_held") == 0, 10, "the producer to free its KV")


def test_selective_disaggregation_prefills_short_prompts_on_the_decode_instance(tiny_model_folder, colocated):
    with tiny_server(tiny_model_folder, "kv_producer") as prefill, tiny_server(tiny_model_folder, "kv_consumer") as decode, \
            router([prefill.base_url], [decode.base_url], prefill_threshold=30) as proxy:
        texts = [_complete(proxy, p)["choices"][0]["text"] for p in _prompts()]
        assert texts == colocated
        routed = proxy.metrics()
        # 34 and 48 tokens went to the producer; 22 stayed on the decode instance.
        assert metric(routed, "jido:router_requests_total", decision="disaggregated") == 2
        assert metric(routed, "jido:router_requests_total", decision="local_prefill") == 1


def test_data_parallel_routing_keeps_a_shared_prefix_on_one_instance(tiny_model_folder):
    prefix = _prompts()[2][:40]
    with tiny_server(tiny_model_folder) as first, tiny_server(tiny_model_folder) as second, \
            router(None, [first.base_url, second.base_url], cache_block_chars=16) as proxy:
        answers = [_complete(proxy, [*prefix, 10 + i]) for i in range(4)]
        assert [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers[1:]] == [40, 40, 40]
        routed = proxy.metrics()
        assert metric(routed, "jido:router_requests_total", decision="data_parallel") == 4
        assert metric(routed, "jido:router_affinity_hits_total", role="decode") == 3
        served = [metric(s.metrics(), "vllm:request_success_total") for s in (first, second)]
        assert sorted(served) == [0, 4]


def test_router_serves_models_tokenize_health_and_metrics(tiny_model_folder):
    name = tiny_model_folder.name  # the served name is the folder's, whatever pytest's temporary folder is called
    with tiny_server(tiny_model_folder) as server, router(None, [server.base_url]) as proxy:
        status, _, body = proxy.request("GET", "/v1/models")
        assert status == 200 and json.loads(body)["data"][0]["id"] == name
        status, _, body = proxy.request("GET", f"/v1/models/{name}")
        assert status == 200 and json.loads(body) == json.loads(server.request("GET", f"/v1/models/{name}")[2])
        status, _, body = proxy.request("GET", "/v1/models/org/other")
        assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
        # /tokenize and /detokenize come from a decode instance: `jido bench` through the router counts tokens
        request = {"prompt": "hello world"}
        status, _, body = proxy.request("POST", "/tokenize", request)
        assert status == 200 and json.loads(body) == json.loads(server.request("POST", "/tokenize", request)[2])
        tokens = json.loads(body)["tokens"]
        status, _, body = proxy.request("POST", "/detokenize", {"tokens": tokens})
        assert status == 200 and json.loads(body) == json.loads(server.request("POST", "/detokenize",
                                                                                {"tokens": tokens})[2])
        status, _, body = proxy.request("GET", "/health")
        assert status == 200 and json.loads(body)["decode"] == [server.base_url]
        routed = proxy.metrics()
        assert metric(routed, "jido:router_instance_healthy", instance=server.base_url, role="decode") == 1
        assert metric(routed, "jido:router_outstanding_tokens", instance=server.base_url) == 0
        status, _, body = proxy.request("POST", "/v1/completions", b"{not json")
        assert status == 400 and b"not valid JSON" in body


def test_health_checks_take_a_dead_instance_out_and_back_in():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    state = {"up": True}

    async def health(request):
        return JSONResponse({"status": "ok"}, status_code=200 if state["up"] else 503)

    fake = Starlette(routes=[Route("/health", health), Route("/kv_transfer", lambda r: JSONResponse({}, 404)),
                             Route("/metrics", lambda r: JSONResponse({}))])
    import threading

    import uvicorn

    from jido.server.launcher import bind_socket
    sock = bind_socket("127.0.0.1", 0)
    uv = uvicorn.Server(uvicorn.Config(fake, log_level="warning"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        wait_until(lambda: uv.started, 30, "the fake instance")
        with router(None, [url], interval=0.05) as proxy:
            def healthy() -> float:
                return metric(proxy.metrics(), "jido:router_instance_healthy", instance=url)
            assert healthy() == 1
            state["up"] = False
            wait_until(lambda: healthy() == 0, 10, "the instance to be taken out")
            status, _, _ = proxy.request("POST", "/v1/completions", _body([BOS_ID, 5]))
            assert status == 503
            state["up"] = True
            wait_until(lambda: healthy() == 1, 10, "the instance to come back in")
    finally:
        uv.should_exit = True
        thread.join(10)


def test_instances_with_another_block_size_stop_the_router_with_a_clear_error(tiny_model_folder):
    with tiny_server(tiny_model_folder, "kv_producer", block_size=8) as prefill, \
            tiny_server(tiny_model_folder, "kv_consumer") as decode:
        proxy = Router(RouterConfig(prefill=[prefill.base_url], decode=[decode.base_url]))

        async def start() -> None:
            try:
                await proxy.start()
            finally:
                await proxy.stop()
        with pytest.raises(ValueError, match="block_size differs|different models"):
            asyncio.run(start())


def test_a_plain_server_as_decode_instance_behind_a_prefill_pool_is_a_startup_error(tiny_model_folder):
    with tiny_server(tiny_model_folder, "kv_producer") as prefill, tiny_server(tiny_model_folder) as plain:
        proxy = Router(RouterConfig(prefill=[prefill.base_url], decode=[plain.base_url]))

        async def start() -> None:
            try:
                await proxy.start()
            finally:
                await proxy.stop()
        with pytest.raises(ValueError, match="has no --kv-transfer-config"):
            asyncio.run(start())


def test_prefill_threshold_comes_from_measured_costs():
    # 1 ms a token to prefill, 20 us a token to transfer plus 4.9 ms a hand-off: they meet at 5 tokens.
    assert derive_prefill_threshold({"prefill_s_per_token": 1e-3, "transfer_s_per_token": 2e-5,
                                     "transfer_fixed_s": 4.9e-3}) == 5
    assert derive_prefill_threshold({"prefill_s_per_token": 1e-5, "transfer_s_per_token": 2e-5,
                                     "transfer_fixed_s": 0.0}) == 2**31 - 1
    with pytest.raises(ValueError, match="transfer_fixed_s"):
        derive_prefill_threshold({"prefill_s_per_token": 1e-3, "transfer_s_per_token": 2e-5})
