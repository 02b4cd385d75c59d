"""ServerConfig: the HTTP server's settings, validated on creation; `jido serve` flags come from its fields."""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from jido.models.named import DEFAULT_MODEL, NAMED_MODELS
from jido.server.tool_parsers import TOOL_CALL_PARSERS

API_KEY_ENV = "JIDO_API_KEY"


def _api_key_from_env() -> str | None:
    """The key from ``JIDO_API_KEY`` (as vLLM reads ``VLLM_API_KEY``); unset or empty means no key."""
    return os.environ.get(API_KEY_ENV) or None


@dataclass(frozen=True)
class ServerConfig:
    """Where to listen and how to protect the engine; each field's docstring is its ``jido serve --help``."""

    host: str = "127.0.0.1"
    """Address to listen on; 0.0.0.0 listens on every interface."""
    port: int = 8000
    """TCP port; 0 picks a free one (the address is logged)."""
    api_key: str | None = field(default_factory=_api_key_from_env, repr=False)
    """Key every endpoint but /health requires as "Authorization: Bearer KEY" (default: $JIDO_API_KEY, else
    none)."""
    served_model_name: str | None = None
    """The model name clients send (default: the model's name for a named model, gemma-3-270m when none is
    given, else the file or folder name)."""
    chat_template: str | None = None
    """A Jinja file that replaces the model's chat template (default: the model's own; a model without one
    answers chat with a 400, as vLLM does)."""
    enable_auto_tool_choice: bool = False
    """vLLM's: with tools and tool_choice "auto", read the model's calls from its answer into tool_calls (needs
    tool_call_parser); without it they stay text in content. "required" and a named function work either way."""
    tool_call_parser: Literal["hermes", "llama3_json"] | None = None
    """How calls are written: hermes (Qwen2.5: <tool_call>{"name", "arguments"}</tool_call>, and the bare or
    fenced JSON calls Qwen2.5-Coder writes), llama3_json (Llama 3: {"name", "parameters"}) (default: none)."""
    enable_tokenizer_info_endpoint: bool = False
    """vLLM's: serve GET /tokenizer_info (the tokenizer's settings and the chat template, which lm-evaluation-harness's
    remote tokenizer reads); off by default, as vLLM, since it shows the chat template and tokenizer settings."""
    max_waiting_requests: int = 256
    """Sequences accepted but not yet running; past it, requests get 503 with Retry-After."""
    max_request_body_bytes: int = 4 * 2**20
    """Largest request body taken; a larger one gets 413."""
    drain_timeout_s: float = 30.0
    """Seconds SIGTERM waits for requests in flight; those still open then end with a 503."""
    header_read_timeout_s: float = 10.0
    """Seconds a connection may take to send its request line and headers before a 408 and close."""
    request_read_timeout_s: float = 30.0
    """Seconds a request body may take to arrive after its headers before a 408 (30 s reads 4 MiB at about
    1 Mbit/s)."""
    timeout_keep_alive_s: float = 5.0
    """Seconds an idle kept-alive connection stays open."""
    limit_concurrency: int = 1024
    """Open connections (or requests in flight) before uvicorn answers 503; above max_waiting_requests plus
    the running ones, so the queue refuses load first."""
    ssl_keyfile: str | None = None
    """PEM private key (unencrypted) to serve HTTPS; goes with ssl_certfile (default: none, plain HTTP)."""
    ssl_certfile: str | None = None
    """PEM certificate chain to serve HTTPS; goes with ssl_keyfile (default: none, plain HTTP)."""
    allow_kernel_fallbacks: bool = False
    """Serve even when a C++ kernel library failed to build, on its PyTorch fallback (several times slower); without
    it `jido serve` stops with the build's error and the command that rebuilds it."""

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an integer in [0, 65535] (0 picks a free port), got {self.port!r}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty: leave it unset to serve without a key")
        for name in ("max_waiting_requests", "max_request_body_bytes", "limit_concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.drain_timeout_s, (int, float)) or self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be a number of seconds >= 0, got {self.drain_timeout_s!r}")
        for name in ("header_read_timeout_s", "request_read_timeout_s", "timeout_keep_alive_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.enable_auto_tool_choice and self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser: one of "
                             f"{', '.join(TOOL_CALL_PARSERS)}, got {self.tool_call_parser!r}")
        self._check_tls()

    @property
    def auto_tool_call_parser(self) -> str | None:
        """The parser for tool_choice "auto" answers, or None when they are not parsed."""
        return self.tool_call_parser if self.enable_auto_tool_choice else None

    def _check_tls(self) -> None:
        """Both TLS files or neither, and they must load as a certificate chain and its private key."""
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ValueError("ssl_keyfile and ssl_certfile go together: give both to serve HTTPS, or neither")
        if self.ssl_keyfile is None or self.ssl_certfile is None:
            return
        for name in ("ssl_keyfile", "ssl_certfile"):
            if not Path(getattr(self, name)).is_file():
                raise ValueError(f"{name}: no such file: {getattr(self, name)}")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            # The empty password makes an encrypted key fail here rather than prompt on the terminal.
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password=lambda: b"")
        except ssl.SSLError as exc:
            raise ValueError(f"ssl_certfile {self.ssl_certfile} and ssl_keyfile {self.ssl_keyfile} are not a PEM "
                             f"certificate and its unencrypted private key: {exc}") from exc

    @property
    def scheme(self) -> str:
        return "http" if self.ssl_certfile is None else "https"

    def model_name(self, model: str | None) -> str:
        """The name clients must send as ``model`` for the engine's ``model`` setting."""
        if self.served_model_name:
            return self.served_model_name
        if model is None or model in NAMED_MODELS:
            return model or DEFAULT_MODEL
        path = Path(model.rstrip("/"))
        return path.name if path.is_dir() else path.stem
