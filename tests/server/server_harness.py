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
import torch
from safetensors.torch import save_file

from jido.config import EngineConfig
from jido.engine.llm_engine import LLMEngine
from jido.models.loader import resolve_model
from jido.planner.prometheus import Metrics, parse_metrics
from jido.server.app import create_app
from jido.server.config import ServerConfig
from jido.server.launcher import bind_socket, uvicorn_server

KV_CACHE = "160MiB"


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
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        else:
            connection = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=60, context=self.ssl_context)
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


# A one-layer Gemma 3 with the default model's tokenizer and chat template: every id and every text the real
# model takes, at a small fraction of its cost per token, for tests that need many generations, not good ones.
_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 32, "query_pre_attn_scalar": 32, "layer_types": ["full_attention"]}


def make_tiny_model(folder: Path) -> Path:
    """Write the tiny random Gemma 3 into ``folder`` (an HF folder jido loads like any other) and return it."""
    default = resolve_model(None)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(default / name, folder / name)
    config = {**json.loads((default / "config.json").read_text()), **_TINY}
    (folder / "config.json").write_text(json.dumps(config))
    hidden, ffn, head_dim = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    layer = {"input_layernorm": (hidden,), "post_attention_layernorm": (hidden,),
             "pre_feedforward_layernorm": (hidden,), "post_feedforward_layernorm": (hidden,),
             "self_attn.q_norm": (head_dim,), "self_attn.k_norm": (head_dim,),
             "self_attn.q_proj": (config["num_attention_heads"] * head_dim, hidden),
             "self_attn.k_proj": (config["num_key_value_heads"] * head_dim, hidden),
             "self_attn.v_proj": (config["num_key_value_heads"] * head_dim, hidden),
             "self_attn.o_proj": (hidden, config["num_attention_heads"] * head_dim),
             "mlp.gate_proj": (ffn, hidden), "mlp.up_proj": (ffn, hidden), "mlp.down_proj": (hidden, ffn)}
    shapes.update({f"model.layers.0.{name}.weight": shape for name, shape in layer.items()})
    generator = torch.Generator().manual_seed(0)
    save_file({name: 0.1 * torch.randn(shape, generator=generator) for name, shape in shapes.items()},
              str(folder / "model.safetensors"))
    return folder


@contextmanager
def running_server(server_config: ServerConfig | None = None, **engine_kwargs: Any) -> Iterator[Server]:
    """Start the app on a free port with uvicorn in a thread; stop it (draining) on exit."""
    server_config = server_config or ServerConfig()
    app = create_app(LLMEngine(EngineConfig.from_kwargs(kv_cache_memory=KV_CACHE, **engine_kwargs)), server_config)
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
