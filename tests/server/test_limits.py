"""Protection: the API key is enforced everywhere but /health, and a full waiting queue answers 503."""
from __future__ import annotations

import http.client
import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from server_harness import metric, running_server, wait_until

from jido.server.config import ServerConfig

pytestmark = pytest.mark.slow

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server():
    # One running sequence and one waiting one: the third request finds the queue full.
    config = ServerConfig(api_key=KEY, max_waiting_requests=1)
    with running_server(config, max_num_seqs=1) as server:
        yield server


@pytest.mark.parametrize("method, path", [("GET", "/v1/models"), ("POST", "/v1/completions"),
                                          ("POST", "/v1/chat/completions"), ("GET", "/metrics")])
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}])
def test_missing_or_wrong_key_gets_401_and_nothing_about_the_model(server, method, path, headers):
    status, response_headers, raw = server.request(method, path, {"prompt": "Hi", "max_tokens": 1}, headers)
    assert (status, response_headers["www-authenticate"]) == (401, "Bearer")
    error = json.loads(raw)["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "authentication_error"
    assert b"gemma" not in raw


def test_health_needs_no_key_and_the_right_key_opens_everything(server):
    assert server.request("GET", "/health")[0] == 200
    assert server.request("GET", "/metrics", headers=AUTH)[0] == 200
    with pytest.raises(openai.AuthenticationError):
        server.client("wrong").models.list()
    response = server.client(KEY).completions.create(model="gemma-3-270m", prompt="Hi", max_tokens=2)
    assert response.usage.completion_tokens == 2


def _open_stream(server, max_tokens: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = {"prompt": "Count to a thousand:", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json", **AUTH})
    return connection, connection.getresponse()


def _read_events(response: http.client.HTTPResponse) -> list[str]:
    return [line.decode().strip() for line in response if line.startswith(b"data: ")]


def test_full_waiting_queue_gets_503_with_retry_after_and_accepted_requests_still_finish(server):
    running_conn, running = _open_stream(server, max_tokens=1000)
    assert running.status == 200
    assert running.readline().startswith(b"data: ")  # it has its first token: it holds the only seat
    waiting_conn, waiting = _open_stream(server, max_tokens=2)
    assert waiting.status == 200
    wait_until(lambda: metric(server.metrics(AUTH), "vllm:num_requests_waiting") == 1, 30,
               "the second request to wait")

    status, headers, raw = server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, AUTH)
    assert status == 503
    assert headers["retry-after"] == "1"
    assert json.loads(raw)["error"]["code"] == "overloaded"
    assert metric(server.metrics(AUTH), "jido:requests_rejected_total", reason="overload") == 1

    running_conn.close()  # the client goes away: its seat frees up for the waiting request
    events = _read_events(waiting)
    waiting_conn.close()
    assert events[-1] == "data: [DONE]"
    tokens = [c for e in events[:-1] for c in json.loads(e[6:])["choices"]]
    assert tokens[-1]["finish_reason"] == "length"
    assert server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, AUTH)[0] == 200


def test_a_burst_on_an_idle_server_fills_the_free_running_slot_and_the_waiting_one(server):
    wait_until(lambda: metric(server.metrics(AUTH), "vllm:num_requests_running") == 0, 30, "the server to be idle")
    rejected = metric(server.metrics(AUTH), "jido:requests_rejected_total", reason="overload")
    body = {"prompt": "Hi", "max_tokens": 2}
    with ThreadPoolExecutor(2) as pool:
        statuses = list(pool.map(lambda _: server.request("POST", "/v1/completions", body, AUTH)[0], range(2)))
    assert statuses == [200, 200]
    assert metric(server.metrics(AUTH), "jido:requests_rejected_total", reason="overload") == rejected
