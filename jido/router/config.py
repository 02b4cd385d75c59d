"""RouterConfig: the ``jido router`` flags, validated; the CLI is generated from its fields."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RouterConfig:
    """Where the instances are, where the router listens, and when a prompt goes to a prefill instance."""

    prefill: list[str] | None = None
    """Prefill instances (kv_producer), base URLs like http://127.0.0.1:8100 (default: none: the router only
    balances the --decode instances, data-parallel and cache-aware)."""
    decode: list[str] | None = None
    """Decode instances (kv_consumer or kv_both; plain servers for data-parallel routing), base URLs."""
    host: str = "127.0.0.1"
    """Address the router listens on."""
    port: int = 8000
    """Port the router listens on (0 picks a free one)."""
    prefill_threshold: int = 0
    """Prompts estimated shorter than this many tokens are prefilled by the decode instance itself (0: every
    prompt goes to a prefill instance); see --calibration."""
    calibration: str | None = None
    """A JSON file of measured costs ({"prefill_s_per_token", "transfer_s_per_token", "transfer_fixed_s"}, as
    benchmarks/disagg_transfer.py writes): sets --prefill-threshold where a hand-off starts to cost less
    than a local prefill (default: none)."""
    decode_queue_threshold: int = 4
    """A decode instance with more requests than this waiting gets even short prompts prefilled elsewhere."""
    chars_per_token: float = 4.0
    """How the router, which never tokenizes, estimates a text prompt's tokens (characters per token)."""
    prefill_timeout_s: float = 60.0
    """A prefill instance that has not answered by then is given up on: the decode instance prefills itself."""
    request_timeout_s: float = 3600.0
    """Seconds one request may take at a decode instance in all."""
    health_check_interval_s: float = 2.0
    """How often every instance's /health is asked; a failed one is taken out until it answers again."""
    health_check_timeout_s: float = 2.0
    """How long a health check waits for an answer."""
    cache_block_chars: int = 256
    """Prefix affinity: prompts are hashed in chunks of this many characters, chained like KV blocks."""
    balance_threshold: int = 4096
    """Prefix affinity yields to load: an instance holding the longest prefix is chosen unless its outstanding
    tokens exceed the least loaded instance's by more than this."""

    def __post_init__(self) -> None:
        for name in ("prefill", "decode"):
            urls = getattr(self, name)
            if urls is not None:
                if any(not u.startswith(("http://", "https://")) for u in urls):
                    raise ValueError(f"--{name} takes base URLs like http://127.0.0.1:8100, got {urls}")
                object.__setattr__(self, name, [u.rstrip("/") for u in urls])
        if not self.decode:
            raise ValueError("the router needs at least one --decode instance")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port!r}")
        for name in ("prefill_threshold", "decode_queue_threshold", "balance_threshold"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {getattr(self, name)!r}")
        for name in ("chars_per_token", "prefill_timeout_s", "request_timeout_s", "health_check_interval_s",
                     "health_check_timeout_s"):
            if not isinstance(getattr(self, name), (int, float)) or not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number, got {getattr(self, name)!r}")
        if not isinstance(self.cache_block_chars, int) or self.cache_block_chars < 1:
            raise ValueError(f"cache_block_chars must be a positive integer, got {self.cache_block_chars!r}")
