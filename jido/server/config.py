"""ServerConfig: the HTTP server's settings, validated on creation; `jido serve` flags come from its fields."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jido.models.loader import DEFAULT_MODEL


@dataclass(frozen=True)
class ServerConfig:
    """Where to listen and how to protect the engine.

    ``port=0`` picks a free port (the address is logged). ``api_key``: when set, every endpoint but
    ``/health`` needs ``Authorization: Bearer <key>``. ``max_waiting_requests`` bounds the sequences
    accepted but not yet running; past it requests get 503 with ``Retry-After``. ``served_model_name``
    defaults to the model's name (``gemma-3-270m`` for the default model, else the file or folder name).
    ``chat_template`` is a Jinja file that overrides the model's chat template.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None
    chat_template: str | None = None
    max_waiting_requests: int = 256
    max_request_body_bytes: int = 4 * 2**20
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an integer in [0, 65535] (0 picks a free port), got {self.port!r}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty: leave it unset to serve without a key")
        for name in ("max_waiting_requests", "max_request_body_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.drain_timeout_s, (int, float)) or self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be a number of seconds >= 0, got {self.drain_timeout_s!r}")

    def model_name(self, model: str | None) -> str:
        """The name clients must send as ``model`` for the engine's ``model`` setting."""
        if self.served_model_name:
            return self.served_model_name
        if model is None or model == DEFAULT_MODEL:
            return DEFAULT_MODEL
        path = Path(model.rstrip("/"))
        return path.name if path.is_dir() else path.stem
