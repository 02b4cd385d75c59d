"""Server test harness: the real default model behind real HTTP on 127.0.0.1, one server per test module."""
from __future__ import annotations

import http.client
import json
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from jido.config import EngineConfig
from jido.engine.llm_engine import LLMEngine
from jido.planner.prometheus import Metrics, parse_metrics
from jido.server.app import create_app
from jido.server.config import ServerConfig
from jido.server.launcher import bind_socket, uvicorn_server

KV_CACHE = "160MiB"
# The default model is a base model without a chat template; servers under test get Gemma's turn format.
GEMMA_CHAT_TEMPLATE = str(Path(__file__).parents[1] / "fixtures" / "gemma3_chat_template.jinja")


class Server:
    """A running server in a background thread of the test process (so tests can also see its engine)."""

    def __init__(self, port: int, serving: Any, ssl_context: ssl.SSLContext | None = None) -> None:
        self.port = port
        self.base_url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
        self.serving = serving
        self.ssl_context = ssl_context

    def client(self, api_key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=api_key, max_retries=0, timeout=60)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=120)

    def request(self, method: str, path: str, body: bytes | dict | None = None,
                headers: dict[str, str | bytes] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One HTTP(S) request; returns status, headers (lower-case names) and the raw body."""
        if self.ssl_context is None:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        else:
            connection = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=120, context=self.ssl_context)
        try:
            data = json.dumps(body).encode() if isinstance(body, dict) else body
            connection.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                                   **(headers or {})})
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            connection.close()

    def metrics(self, headers: dict[str, str | bytes] | None = None) -> Metrics:
        status, _, body = self.request("GET", "/metrics", headers=headers)
        assert status == 200
        return parse_metrics(body.decode())


@contextmanager
def running_server(server_config: ServerConfig | None = None, engine: LLMEngine | None = None,
                   **engine_kwargs: Any) -> Iterator[Server]:
    """Start the app on a free port with uvicorn in a thread; stop it (draining) on exit.

    Without ``server_config``, the server has Gemma's chat template (tests/fixtures) for chat. It serves
    ``engine`` if given, else a new engine of ``engine_kwargs``, which it shuts down on exit.
    """
    server_config = server_config or ServerConfig(chat_template=GEMMA_CHAT_TEMPLATE)
    if engine is not None:
        yield from _serve(engine, server_config)
        return
    with LLMEngine(EngineConfig.from_kwargs(**{"kv_cache_memory": KV_CACHE, "dtype": "float32",
                                               **engine_kwargs})) as own:
        yield from _serve(own, server_config)


def _serve(engine: LLMEngine, server_config: ServerConfig) -> Iterator[Server]:
    app = create_app(engine, server_config)
    sock = bind_socket("127.0.0.1", 0)
    uv = uvicorn_server(app, server_config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: uv.started, 60, "the server to start")
        yield Server(sock.getsockname()[1], app.state.serving, _client_context(server_config))
    finally:
        uv.should_exit = True
        thread.join(30)


def _client_context(config: ServerConfig) -> ssl.SSLContext | None:
    """A client context that trusts the server's own (self-signed) certificate, for an HTTPS server."""
    return None if config.ssl_certfile is None else ssl.create_default_context(cafile=config.ssl_certfile)


def self_signed_cert(directory: Path) -> tuple[str, str]:
    """A key and a certificate for 127.0.0.1 made with the openssl command; skips the test without it."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a self-signed certificate")
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return str(key), str(cert)


def wait_until(condition: Callable[[], object], timeout_s: float, what: str) -> object:
    """Poll ``condition`` until it is truthy; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def metric(metrics: Metrics, name: str, **labels: str) -> float:
    """The value of one sample (summed over label sets that match ``labels``)."""
    samples = [v for sample_labels, v in metrics.samples.get(name, []) if labels.items() <= sample_labels.items()]
    assert samples, f"{name}{labels or ''} is missing from /metrics"
    return sum(samples)
