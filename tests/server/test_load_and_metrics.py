"""Many streams at once, clients that hang up, and the Prometheus metrics all of that leaves behind."""
from __future__ import annotations

import asyncio
import http.client
import json
import socket

import pytest
from server_harness import metric, running_server, wait_until

pytestmark = pytest.mark.slow

NUM_STREAMS, STREAM_TOKENS = 50, 4
LONG = {"prompt": "Write a very long story:", "max_tokens": 2000, "ignore_eos": True}


@pytest.fixture(scope="module")
def server():
    with running_server() as server:
        yield server


async def _stream(client, index: int) -> tuple[str, str, int]:
    chunks = await client.completions.create(
        model="gemma-3-270m", prompt=f"Story number {index}:", max_tokens=STREAM_TOKENS, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    text, finish, usage = "", None, None
    async for chunk in chunks:
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
    return text, finish, usage.completion_tokens


def test_50_concurrent_streams_all_complete_with_their_lengths(server):
    async def run_all():
        client = server.async_client()
        return await asyncio.gather(*(_stream(client, i) for i in range(NUM_STREAMS)))

    results = asyncio.run(run_all())
    assert [(finish, num_tokens) for _, finish, num_tokens in results] == [("length", STREAM_TOKENS)] * NUM_STREAMS
    # Batched with 49 others, each stream still says what it says alone.
    alone = server.client().completions.create(model="gemma-3-270m", prompt="Story number 7:", temperature=0,
                                               max_tokens=STREAM_TOKENS, extra_body={"ignore_eos": True})
    assert results[7][0] == alone.choices[0].text


def _idle(server) -> bool:
    metrics = server.metrics()
    return (metric(metrics, "vllm:kv_cache_usage_perc") == 0 and metric(metrics, "vllm:num_requests_running") == 0
            and metric(metrics, "vllm:num_requests_waiting") == 0)


def _running(server) -> bool:
    metrics = server.metrics()
    return metric(metrics, "vllm:num_requests_running") == 1 and metric(metrics, "vllm:kv_cache_usage_perc") > 0


def test_stream_disconnect_aborts_the_request_and_frees_its_blocks(server):
    wait_until(lambda: _idle(server), 30, "the server to be idle")
    aborted = metric(server.metrics(), "jido:requests_aborted_total")
    success_abort = metric(server.metrics(), "vllm:request_success_total", finished_reason="abort")
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("POST", "/v1/completions", json.dumps({**LONG, "stream": True}),
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.readline().startswith(b"data: ")
    wait_until(lambda: _running(server), 30, "the request to hold KV blocks")
    connection.close()
    wait_until(lambda: _idle(server), 30, "the KV blocks to come back")
    assert metric(server.metrics(), "jido:requests_aborted_total") == aborted + 1
    assert metric(server.metrics(), "vllm:request_success_total", finished_reason="abort") == success_abort + 1


def test_non_streaming_disconnect_aborts_the_request_and_frees_its_blocks(server):
    wait_until(lambda: _idle(server), 30, "the server to be idle")
    body = json.dumps(LONG).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: _running(server), 30, "the request to hold KV blocks")
    wait_until(lambda: _idle(server), 30, "the KV blocks to come back")


HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
              "vllm:request_time_per_output_token_seconds", "vllm:request_prompt_tokens",
              "vllm:request_generation_tokens", "jido:step_tokens")
COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total")


def test_metrics_expose_every_named_metric_with_sane_values(server):
    client = server.client()
    shared = "The same long preamble for every request, long enough to fill blocks. " * 4
    for question in ("one", "two"):
        client.completions.create(model="gemma-3-270m", prompt=shared + question, max_tokens=3, temperature=0,
                                  extra_body={"ignore_eos": True})
    wait_until(lambda: _idle(server), 30, "the server to be idle")
    status, headers, raw = server.request("GET", "/metrics")
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    text = raw.decode()
    metrics = server.metrics()

    for name in HISTOGRAMS:
        assert f"# TYPE {name} histogram" in text
        count, total = metric(metrics, f"{name}_count"), metric(metrics, f"{name}_sum")
        assert count > 0 and total >= 0, name
        assert metric(metrics, f"{name}_bucket", le="+Inf") == count
    for phase in ("schedule", "model", "sample", "update"):
        assert metric(metrics, "jido:step_time_seconds_count", phase=phase) > 0
    assert 0 < metrics.histogram_mean("vllm:time_to_first_token_seconds") < 60
    assert metrics.histogram_mean("vllm:time_to_first_token_seconds") <= metrics.histogram_mean(
        "vllm:e2e_request_latency_seconds")
    for name in COUNTERS:
        assert f"# TYPE {name} counter" in text
        assert metric(metrics, name) >= 0
    assert 0 < metric(metrics, "vllm:prefix_cache_hits_total") <= metric(metrics, "vllm:prefix_cache_queries_total")
    assert metric(metrics, "vllm:prompt_tokens_total") == metric(metrics, "vllm:request_prompt_tokens_sum")
    # Requests abandoned by their clients (the disconnect tests before) count as finished_reason="abort" but have no
    # end-to-end latency; every other finished request has one.
    finished = sum(v for labels, v in metrics.samples["vllm:request_success_total"]
                   if labels.get("finished_reason") != "abort")
    assert finished == metric(metrics, "vllm:e2e_request_latency_seconds_count") >= 2
    assert metric(metrics, "vllm:request_success_total", finished_reason="length") >= 2
    assert metric(metrics, "vllm:generation_tokens_total") >= metric(metrics, "vllm:request_generation_tokens_sum")
    assert metric(metrics, "vllm:num_requests_running") == metric(metrics, "vllm:num_requests_waiting") == 0
    assert metric(metrics, "vllm:kv_cache_usage_perc") == 0
