"""serve(): load the engine, listen, serve until SIGTERM or Ctrl-C, drain in-flight requests, return 0."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import socket
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from jido.config import EngineConfig
from jido.engine.llm_engine import LLMEngine
from jido.server.app import create_app
from jido.server.config import ServerConfig
from jido.server.connection import JidoH11Protocol
from jido.utils.cpp_build import REBUILD_COMMAND
from jido.utils.drain_signals import drained_signals_exit_cleanly

logger = logging.getLogger("jido")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket; ``port=0`` takes a free one (read it back with ``getsockname``).

    Connections made before the server starts wait in the backlog rather than being refused.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    return sock


# Uvicorn's own drain timeout runs this much longer than ours, so that requests ended at our timeout
# can send their 503 or last events before uvicorn cancels what is left.
_END_STREAMS_GRACE_S = 5.0


class _DrainingServer(uvicorn.Server):
    """Uvicorn whose drain ends the requests still open after ``drain_timeout_s`` with a clean 503.

    Uvicorn drains on shutdown: it stops accepting and waits for open requests; past its timeout it
    cancels them, which cuts streams off with no error event or ``[DONE]`` and logs a traceback each.
    """

    def __init__(self, config: uvicorn.Config, drain_timeout_s: float, end_streams: Callable[[str], None]) -> None:
        super().__init__(config)
        self.drain_timeout_s = drain_timeout_s
        self.end_streams = end_streams

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        message = (f"the server is shutting down: the request did not finish within the "
                   f"{self.drain_timeout_s:g} s drain timeout")
        timer = asyncio.get_running_loop().call_later(self.drain_timeout_s, self.end_streams, message)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def uvicorn_server(app: FastAPI, config: ServerConfig) -> uvicorn.Server:
    """A uvicorn server for an app from ``create_app``, draining as ``_DrainingServer`` says."""
    protocol = functools.partial(JidoH11Protocol, header_read_timeout_s=config.header_read_timeout_s)
    uv_config = uvicorn.Config(app, http=protocol, log_config=None, access_log=False, lifespan="on",
                               timeout_graceful_shutdown=config.drain_timeout_s + _END_STREAMS_GRACE_S,
                               timeout_keep_alive=config.timeout_keep_alive_s,
                               limit_concurrency=config.limit_concurrency,
                               ssl_keyfile=config.ssl_keyfile, ssl_certfile=config.ssl_certfile)
    return _DrainingServer(uv_config, config.drain_timeout_s, app.state.serving.engine.end_streams)


def serve(engine_config: EngineConfig, config: ServerConfig) -> int:
    """Run the server in this process until SIGTERM/SIGINT; returns 0 once in-flight requests drained.

    If the engine dies (a worker process was killed or crashed), every in-flight request has already been
    ended with the error and /health answers 503; the server then stops and returns 1, so that a supervisor
    (systemd, Kubernetes) restarts it with fresh workers. It does not restart workers itself: their KV caches
    and the requests on them are gone either way.
    """
    engine_config = with_worker_process(engine_config)
    replicas: list[LLMEngine] = []
    failure: list[BaseException] = []

    def on_engine_failure(error: BaseException) -> None:
        logger.error("the engine failed (%s): stopping the server with exit code 1", error)
        failure.append(error)
        server.should_exit = True

    try:
        for _ in range(engine_config.parallel_config.data_parallel_size):
            replicas.append(LLMEngine(engine_config))
        check_kernels(replicas[0].kernel_fallbacks, config.allow_kernel_fallbacks)
        app = create_app(replicas, config, on_engine_failure)
        sock = bind_socket(config.host, config.port)
        host, port = sock.getsockname()[:2]
        _log_usage(config, host, port, config.model_name(engine_config.model_config.model),
                   chat=app.state.serving.chat_template is not None)
        server = uvicorn_server(app, config)
        with drained_signals_exit_cleanly():
            server.run(sockets=[sock])
    finally:
        for llm in replicas:
            llm.shutdown()
    return 1 if failure else 0


class KernelsMissingError(RuntimeError):
    """A C++ kernel library failed to build and the server was not told to serve on its slower fallback."""


def check_kernels(fallbacks: dict[str, str], allowed: bool) -> None:
    """Refuse to serve on PyTorch fallbacks unless ``allow_kernel_fallbacks`` says so: a server several times slower
    than it should be is found only by measuring it, so it stops at start with the reason instead.

    Raises:
        KernelsMissingError: ``fallbacks`` (library -> what runs instead, and why) is not empty and not ``allowed``.
    """
    if fallbacks and not allowed:
        raise KernelsMissingError(
            f"{len(fallbacks)} C++ kernel libraries failed to build, so this server would run several times slower "
            f"on their fallbacks: {'; '.join(f'{lib}: {what}' for lib, what in sorted(fallbacks.items()))}. Run "
            f"`{REBUILD_COMMAND}` to rebuild them (it keeps each compiler's output), or pass "
            "--allow-kernel-fallbacks to serve on the fallbacks on purpose")


def with_worker_process(engine_config: EngineConfig) -> EngineConfig:
    """The config ``jido serve`` runs: the model in a worker process (``mp``) unless an executor was chosen.

    In the server's own process the engine thread shares the interpreter and the cores with the event loop that
    streams every token, and the model's threads lost time to it: served with ``uni``, TPOT fell well short of
    offline, while ``mp`` came close to it.
    vLLM's engine core runs in its own process for the same reason.
    """
    parallel = engine_config.parallel_config
    if parallel.distributed_executor_backend is not None:
        return engine_config
    return dataclasses.replace(engine_config,
                               parallel_config=dataclasses.replace(parallel, distributed_executor_backend="mp"))


def _log_usage(config: ServerConfig, host: str, port: int, model_name: str, chat: bool) -> None:
    """The address, and a curl line to paste: a chat for a model with a chat template, else a completion."""
    base = f"{config.scheme}://{host if ':' not in host else f'[{host}]'}:{port}"
    path, text = ("chat/completions", {"messages": [{"role": "user", "content": "Hello!"}]}) if chat else (
        "completions", {"prompt": "The capital of France is"})
    body = json.dumps({"model": model_name, **text, "max_tokens": 32})
    auth = " -H 'Authorization: Bearer <key>'" if config.api_key is not None else ""
    logger.info("jido serve: listening on %s (OpenAI API at %s/v1, metrics at %s/metrics)", base, base, base)
    logger.info("try: curl %s/v1/%s -H 'Content-Type: application/json'%s -d '%s'", base, path, auth, body)
