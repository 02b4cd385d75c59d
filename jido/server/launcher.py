"""serve(): load the engine, listen, serve until SIGTERM or Ctrl-C, drain in-flight requests, return 0."""
from __future__ import annotations

import json
import logging
import signal
import socket

import uvicorn

from jido.config import EngineConfig
from jido.engine.llm_engine import LLMEngine
from jido.server.app import create_app
from jido.server.config import ServerConfig

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


def uvicorn_server(app: object, config: ServerConfig) -> uvicorn.Server:
    # Uvicorn drains on shutdown: it stops accepting, waits for open requests up to the timeout,
    # then cancels them (which aborts their engine requests).
    return uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                                         timeout_graceful_shutdown=config.drain_timeout_s,
                                         timeout_keep_alive=config.timeout_keep_alive_s,
                                         limit_concurrency=config.limit_concurrency,
                                         ssl_keyfile=config.ssl_keyfile, ssl_certfile=config.ssl_certfile))


def serve(engine_config: EngineConfig, config: ServerConfig) -> int:
    """Run the server in this process until SIGTERM/SIGINT; returns 0 once in-flight requests drained."""
    llm = LLMEngine(engine_config)
    app = create_app(llm, config)
    sock = bind_socket(config.host, config.port)
    host, port = sock.getsockname()[:2]
    _log_usage(config, host, port, config.model_name(engine_config.model_config.model))
    server = uvicorn_server(app, config)
    # Uvicorn re-raises the signal once it has drained; handling it here makes that a clean exit 0.
    previous = {sig: signal.signal(sig, _drained) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        llm.shutdown()
    return 0


def _drained(signum: int, frame: object) -> None:
    logger.info("%s: drained, exiting", signal.Signals(signum).name)


def _log_usage(config: ServerConfig, host: str, port: int, model_name: str) -> None:
    base = f"{config.scheme}://{host if ':' not in host else f'[{host}]'}:{port}"
    body = json.dumps({"model": model_name, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32})
    auth = " -H 'Authorization: Bearer <key>'" if config.api_key is not None else ""
    logger.info("jido serve: listening on %s (OpenAI API at %s/v1, metrics at %s/metrics)", base, base, base)
    logger.info("try: curl %s/v1/chat/completions -H 'Content-Type: application/json'%s -d '%s'",
                base, auth, body)
