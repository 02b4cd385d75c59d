"""CacheConfig: the paged KV cache's block size, memory and prefix caching."""
from __future__ import annotations

from dataclasses import dataclass

from jido.config.size import check_positive_int, parse_size


@dataclass(frozen=True)
class CacheConfig:
    """``kv_cache_memory`` is bytes or a size like ``"512MiB"``; it sizes the block pool."""

    block_size: int = 16
    kv_cache_memory: int | str = "2GiB"
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        check_positive_int("block_size", self.block_size)
        parse_size(self.kv_cache_memory)

    @property
    def kv_cache_bytes(self) -> int:
        return parse_size(self.kv_cache_memory)
