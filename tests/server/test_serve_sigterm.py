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

import pytest
from server_harness import KV_CACHE, wait_until

pytestmark = pytest.mark.slow

STREAM_TOKENS = 60


def _start_serve() -> tuple[subprocess.Popen, queue.Queue, threading.Thread]:
    process = subprocess.Popen(
        [sys.executable, "-m", "jido.cli", "serve", "--port", "0", "--kv-cache-memory", KV_CACHE,
         "--drain-timeout-s", "120"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True)
    reader.start()
    return process, lines, reader


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


def _refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_finishes_in_flight_streams_then_exits_0():
    process, lines, reader = _start_serve()
    try:
        port, _ = _wait_for_port(lines, 120)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = {"prompt": "Once upon a time", "max_tokens": STREAM_TOKENS, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        events = [response.readline()]  # the first token is out: the request is in flight
        process.send_signal(signal.SIGTERM)

        wait_until(lambda: _refuses_connections(port), 30, "the server to stop accepting connections")
        events += list(response)
        data = [e.decode().strip()[6:] for e in events if e.startswith(b"data: ")]
        assert data[-1] == "[DONE]"
        assert json.loads(data[-2])["usage"]["completion_tokens"] == STREAM_TOKENS
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(10)
    stderr = []
    while not lines.empty():
        stderr.append(lines.get())
    assert any("SIGTERM: drained" in line for line in stderr), "".join(stderr)
