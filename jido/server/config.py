"""ServerConfig: the HTTP server's settings, validated on creation; `jido serve` flags come from its fields."""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from jido.models.loader import DEFAULT_MODEL

API_KEY_ENV = "JIDO_API_KEY"


def _api_key_from_env() -> str | None:
    """The key from ``JIDO_API_KEY`` (as vLLM reads ``VLLM_API_KEY``); unset or empty means no key."""
    return os.environ.get(API_KEY_ENV) or None


@dataclass(frozen=True)
class ServerConfig:
    """Where to listen and how to protect the engine.

    ``port=0`` picks a free port (the address is logged). ``api_key``: when set, every endpoint but
    ``/health`` needs ``Authorization: Bearer <key>``; when not given it comes from ``JIDO_API_KEY``
    (``api_key=None`` given explicitly means no key). ``max_waiting_requests`` bounds the sequences
    accepted but not yet running; past it requests get 503 with ``Retry-After``. ``served_model_name``
    defaults to the model's name (``gemma-3-270m`` for the default model, else the file or folder name).
    ``chat_template`` is a Jinja file that overrides the model's chat template. ``ssl_keyfile`` and
    ``ssl_certfile`` (PEM files, both or neither; the key unencrypted) serve HTTPS instead of HTTP.
    Slow clients: a connection whose request line and headers are not complete ``header_read_timeout_s``
    after it opened (or after the first byte of its next request) gets 408 and is closed; a request body not fully received ``request_read_timeout_s`` after its headers gets 408;
    an idle keep-alive connection is closed after ``timeout_keep_alive_s``; past ``limit_concurrency``
    open connections (or requests in flight), new requests get 503.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = field(default_factory=_api_key_from_env, repr=False)
    served_model_name: str | None = None
    chat_template: str | None = None
    max_waiting_requests: int = 256
    max_request_body_bytes: int = 4 * 2**20
    drain_timeout_s: float = 30.0
    header_read_timeout_s: float = 10.0
    # 30 s reads the largest default body (4 MiB) at about 1 Mbit/s.
    request_read_timeout_s: float = 30.0
    timeout_keep_alive_s: float = 5.0
    # Above max_waiting_requests plus the running ones, so the queue, not this, refuses load first.
    limit_concurrency: int = 1024
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None

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
        self._check_tls()

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
        if model is None or model == DEFAULT_MODEL:
            return DEFAULT_MODEL
        path = Path(model.rstrip("/"))
        return path.name if path.is_dir() else path.stem
