"""`jido router` as a real process: SIGTERM lets a stream in flight finish, then the router exits 0 (as
`jido serve` does), so a supervisor does not count a clean stop as a crash."""
from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from router_harness import tiny_server
from server.server_harness import wait_until
from tiny_model_folder import BOS_ID

from jido.server.launcher import bind_socket


def _free_port() -> int:
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    return port


def _health(port: int) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status
    except OSError:
        return 0
    finally:
        connection.close()


def test_sigterm_drains_a_stream_through_the_router_then_exits_0(tiny_model_folder):
    with tiny_server(tiny_model_folder) as decode:
        port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        router = subprocess.Popen([sys.executable, "-m", "jido.cli", "router", "--decode", decode.base_url,
                                   "--port", str(port), "--health-check-interval-s", "0.2"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: router.poll() is not None or _health(port) == 200, 60, "the router to route")
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            body = {"prompt": [BOS_ID, 5, 6, 7], "max_tokens": 40, "ignore_eos": True, "stream": True}
            connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200 and response.readline().startswith(b"data: ")  # in flight
            router.send_signal(signal.SIGTERM)
            events = [line.strip() for line in response if line.startswith(b"data: ")]
            connection.close()
            assert router.wait(60) == 0, router.stderr.read()
        finally:
            if router.poll() is None:
                router.kill()
                router.wait()
    assert events[-1] == b"data: [DONE]"
    choices = [c for e in events[:-1] for c in json.loads(e[6:])["choices"]]
    assert choices[-1]["finish_reason"] == "length"
    assert "SIGTERM: drained, exiting" in router.stderr.read()
