"""Protection: the API key everywhere but /health, 503 on a full waiting queue or too many connections,
and 408 for a body that trickles in too slowly."""
from __future__ import annotations

import http.client
import itertools
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from server_harness import metric, running_server, wait_until

from jido.server.config import ServerConfig

pytestmark = pytest.mark.slow

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
READ_TIMEOUT_S = 1.0
HEADER_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 8


@pytest.fixture(scope="module")
def server():
    # One running sequence and one waiting one: the third request finds the queue full.
    config = ServerConfig(api_key=KEY, max_waiting_requests=1, request_read_timeout_s=READ_TIMEOUT_S,
                          header_read_timeout_s=HEADER_TIMEOUT_S, limit_concurrency=MAX_CONNECTIONS)
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


def _trickle(port: int, head: bytes, trickled: bytes, seconds: float) -> tuple[bytes, float]:
    """Send ``head``, then ``trickled`` one byte every 0.1 s (round and round); returns what the server sent
    until it closed the connection (or ``seconds`` passed), and when it began answering."""
    start = time.monotonic()  # before connecting: the server's clock starts when it accepts
    sock = socket.create_connection(("127.0.0.1", port), timeout=0.1)
    sock.sendall(head)
    received, answered_at = b"", None
    for i in itertools.count():
        if time.monotonic() - start >= seconds:
            break
        try:
            sock.sendall(trickled[i % len(trickled):][:1])
        except OSError:  # the server closed the connection
            pass
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        answered_at = answered_at or time.monotonic() - start
        received += chunk
    sock.close()
    return received, answered_at


def _trickle_body(port: int, seconds: float) -> tuple[bytes, float]:
    """Headers promising 100 body bytes, then one body byte every 0.1 s."""
    return _trickle(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n{", b" ", seconds)


def test_a_body_that_trickles_in_gets_408_and_the_connection_closes(server):
    received, answered_at = _trickle_body(server.port, seconds=READ_TIMEOUT_S + 10)
    assert received.startswith(b"HTTP/1.1 408 "), received
    assert b"connection: close" in received.lower()
    error = json.loads(received.split(b"\r\n\r\n", 1)[1])["error"]
    assert (error["code"], error["message"]) == ("request_timeout", "request body was not received within 1 s")
    assert READ_TIMEOUT_S <= answered_at < READ_TIMEOUT_S + 3


def test_a_normal_request_is_served_while_a_body_trickles_in(server):
    slow = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                 + b"\r\nContent-Length: 100\r\n\r\n{")
    assert server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, AUTH)[0] == 200
    assert slow.recv(65536).startswith(b"HTTP/1.1 408 ")
    slow.close()


# The trickled part never ends (a path or a header value growing a byte at a time), so only the timeout ends it.
@pytest.mark.parametrize("head", [b"POST /v1/", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: "])
def test_a_request_line_or_headers_that_trickle_in_get_408_and_the_connection_closes(server, head):
    received, answered_at = _trickle(server.port, head, b"a", seconds=HEADER_TIMEOUT_S + 10)
    assert received.startswith(b"HTTP/1.1 408 "), received
    assert b"connection: close" in received.lower()
    error = json.loads(received.split(b"\r\n\r\n", 1)[1])["error"]
    assert (error["code"], error["message"]) == ("request_timeout",
                                                 "request line and headers were not received within 1 s")
    assert HEADER_TIMEOUT_S <= answered_at < HEADER_TIMEOUT_S + 5


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(server):
    start = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=HEADER_TIMEOUT_S + 10)
    assert sock.recv(65536) == b""
    assert HEADER_TIMEOUT_S <= time.monotonic() - start < HEADER_TIMEOUT_S + 5
    sock.close()


def test_a_keep_alive_connection_idle_past_the_header_timeout_serves_its_next_request(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    connection.request("GET", "/v1/models", headers=AUTH)
    assert connection.getresponse().read()
    first_socket = connection.sock
    time.sleep(HEADER_TIMEOUT_S * 1.5)  # idle between requests is the keep-alive timeout's (5 s), not this one's
    connection.request("GET", "/v1/models", headers=AUTH)
    assert connection.getresponse().status == 200 and connection.sock is first_socket
    connection.close()


def test_an_unparsable_request_gets_400_with_an_error_body(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        received = b"".join(iter(lambda: sock.recv(65536), b""))
    assert received.startswith(b"HTTP/1.1 400 "), received
    error = json.loads(received.split(b"\r\n\r\n", 1)[1])["error"]
    assert (error["type"], error["code"], error["message"]) == (
        "invalid_request_error", "invalid_http", "the request is not valid HTTP/1.1; the connection is closed")


def test_connections_past_the_limit_get_503_with_an_error_body_until_some_close(server):
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        wait_until(lambda: server.request("GET", "/v1/models", headers=AUTH)[0] == 503, 10,
                   "a connection past the limit to get 503")
        status, headers, raw = server.request("GET", "/v1/models", headers=AUTH)
        assert (status, headers["retry-after"], headers["connection"]) == (503, "1", "close")
        error = json.loads(raw)["error"]
        assert (error["type"], error["code"]) == ("service_unavailable", "too_many_connections")
        assert f"limit of {MAX_CONNECTIONS} open connections" in error["message"]
    finally:
        for sock in idle:
            sock.close()
    wait_until(lambda: server.request("GET", "/v1/models", headers=AUTH)[0] == 200, 10,
               "the server to serve again once the idle connections closed")


def test_health_is_answered_past_the_connection_limit(server):
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        wait_until(lambda: server.request("GET", "/v1/models", headers=AUTH)[0] == 503, 10,
                   "a connection past the limit to get 503")
        status, _, raw = server.request("GET", "/health")
        assert (status, json.loads(raw)) == (200, {"status": "ok"})
        assert server.request("HEAD", "/health")[0] == 200
    finally:
        for sock in idle:
            sock.close()
