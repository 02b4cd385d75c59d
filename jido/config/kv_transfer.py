"""KVTransferConfig: vLLM's ``--kv-transfer-config`` JSON, validated."""
from __future__ import annotations

from dataclasses import dataclass

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


@dataclass(frozen=True)
class KVTransferConfig:
    """Which connector moves KV between instances, this instance's role, and where it listens."""

    kv_connector: str
    kv_role: str = "kv_both"
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579

    def __post_init__(self) -> None:
        if not self.kv_connector:
            raise ValueError("kv_transfer_config needs a 'kv_connector'")
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_role must be one of {', '.join(KV_ROLES)}, got {self.kv_role!r}")
        if not isinstance(self.kv_port, int) or not 0 < self.kv_port < 65536:
            raise ValueError(f"kv_port must be a TCP port in 1..65535, got {self.kv_port!r}")
