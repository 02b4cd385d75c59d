"""Router test harness: jido servers (in this process, or a real `jido serve` process to kill) behind a router."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from server.server_harness import Server, running_server, wait_until

from jido.router.app import create_router_app
from jido.router.config import RouterConfig
from jido.server.config import ServerConfig
from jido.server.launcher import bind_socket

TINY = dict(dtype="float32", kv_cache_memory="512KiB", block_size=4)


def kv_config(role: str, transport: str = "tcp", **extra: Any) -> str:
    return json.dumps({"kv_connector": transport, "kv_role": role, "kv_port": 0, **extra})


@contextmanager
def tiny_server(folder: Path, role: str | None = None, transport: str = "tcp", **extra: Any) -> Iterator[Server]:
    """A tiny-model server in a thread; with ``role``, a KV producer or consumer over ``transport``."""
    engine = {k: extra.pop(k) for k in list(extra) if k in ("block_size", "kv_cache_memory", "max_num_seqs")}
    kwargs = {**TINY, **engine, "model": str(folder)}
    if role is not None:
        kwargs["kv_transfer_config"] = kv_config(role, transport, **extra)
    with running_server(ServerConfig(), **kwargs) as server:
        try:
            yield server
        finally:
            server.serving.llm.shutdown()  # as `jido serve` does on exit: the KV endpoint's threads stop


@contextmanager
def router(prefill: list[str] | None, decode: list[str], **options: Any) -> Iterator[Server]:
    """The router app on a free port, in a thread; stopped on exit."""
    config = RouterConfig(prefill=prefill, decode=decode, health_check_interval_s=options.pop("interval", 0.2),
                          **options)
    app = create_router_app(config)
    sock = bind_socket("127.0.0.1", 0)
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: uv.started or not thread.is_alive(), 60, "the router to start")
        if not uv.started:
            raise RuntimeError("the router did not start")
        yield Server(sock.getsockname()[1], app.state.router)
    finally:
        uv.should_exit = True
        thread.join(30)


@contextmanager
def serve_process(folder: Path, role: str, transport: str, tmp_path: Path,
                  **extra: Any) -> Iterator[tuple[str, subprocess.Popen]]:
    """`jido serve` in its own process (to be killed); yields its base URL and process once it answers /health."""
    port_file = tmp_path / f"port-{role}"
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    args = [sys.executable, "-m", "jido.cli", "--log-level", "WARNING", "serve", "--model", str(folder),
            "--dtype", "float32", "--kv-cache-memory", TINY["kv_cache_memory"], "--block-size", "4",
            "--port", str(port), "--kv-transfer-config", kv_config(role, transport, **extra)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    process = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=open(port_file, "wb"))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: process.poll() is not None or _answers(url), 120, f"`jido serve` on {url}")
        assert process.poll() is None, port_file.read_text()
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(30)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False
