"""`jido serve` as a real process: SIGTERM stops new connections, finishes in-flight requests, exits 0."""
from __future__ import annotations

import http.client
import json
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
from server_harness import KV_CACHE, metric, wait_until

from jido.planner.prometheus import parse_metrics

pytestmark = pytest.mark.slow

STREAM_TOKENS = 60


@contextmanager
def _serving(drain_timeout_s: float = 120) -> Iterator[tuple[subprocess.Popen, int, list[str]]]:
    """A `jido serve` process listening on a free port; on leaving, it is killed if still running and its
    stderr after the listening line lands in the yielded list."""
    process = subprocess.Popen(
        [sys.executable, "-m", "jido.cli", "serve", "--port", "0", "--kv-cache-memory", KV_CACHE,
         "--drain-timeout-s", str(drain_timeout_s)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True)
    reader.start()
    stderr: list[str] = []
    try:
        port, _ = _wait_for_port(lines, 120)
        yield process, port, stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(10)
        while not lines.empty():
            stderr.append(lines.get())


def _wait_for_port(lines: queue.Queue, timeout_s: float) -> tuple[int, list[str]]:
    deadline, seen = time.monotonic() + timeout_s, []
    while time.monotonic() < deadline:
        try:
            seen.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            break
        match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", seen[-1])
        if match:
            return int(match.group(1)), seen
    pytest.fail("jido serve did not start listening:\n" + "".join(seen))


def _post(port: int, body: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return connection, connection.getresponse()


def _refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_finishes_in_flight_streams_then_exits_0():
    with _serving() as (process, port, stderr):
        body = {"prompt": "Once upon a time", "max_tokens": STREAM_TOKENS, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        _, response = _post(port, body)
        events = [response.readline()]  # the first token is out: the request is in flight
        process.send_signal(signal.SIGTERM)

        wait_until(lambda: _refuses_connections(port), 30, "the server to stop accepting connections")
        events += list(response)
        data = [e.decode().strip()[6:] for e in events if e.startswith(b"data: ")]
        assert data[-1] == "[DONE]"
        assert json.loads(data[-2])["usage"]["completion_tokens"] == STREAM_TOKENS
        assert process.wait(timeout=60) == 0
    assert any("SIGTERM: drained" in line for line in stderr), "".join(stderr)


def _num_running(port: int) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", "/metrics")
    return metric(parse_metrics(connection.getresponse().read().decode()), "vllm:num_requests_running")


def test_requests_outliving_the_drain_timeout_end_with_a_clean_503_and_no_traceback():
    with _serving(drain_timeout_s=1) as (process, port, stderr):
        long = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True}
        _, streaming = _post(port, {**long, "stream": True})
        events = [streaming.readline()]  # the first token is out: the stream is in flight
        with ThreadPoolExecutor(1) as pool:
            plain = pool.submit(lambda: _post(port, long)[1])
            wait_until(lambda: _num_running(port) == 2, 30, "the non-streaming request to run too")
            process.send_signal(signal.SIGTERM)
            events += list(streaming)
            answer = plain.result()
            assert (answer.status, json.loads(answer.read())["error"]["code"]) == (503, "unavailable")
        data = [e.decode().strip()[6:] for e in events if e.startswith(b"data: ")]
        assert data[-1] == "[DONE]"
        error = json.loads(data[-2])["error"]
        assert (error["type"], error["code"]) == ("service_unavailable", "unavailable")
        assert "the server is shutting down" in error["message"]
        assert process.wait(timeout=60) == 0
    log = "".join(stderr)
    assert "Traceback" not in log and "Cancel" not in log, log
