"""KVOffloadConfig: the ``--kv-offload`` JSON (LMCache-style tiers below the device pool), validated."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from jido.config.size import parse_size

TIER_ORDER = ("cpu", "disk", "remote")  # searched in this order; evicted entries move down it
KV_CODECS = ("raw", "int8", "cachegen")


@dataclass(frozen=True)
class TierConfig:
    """One offload tier: its byte budget (local tiers), where it lives, its codec and (remote) timeout."""

    name: str
    size_bytes: int | None = None
    path: str | None = None
    url: str | None = None
    codec: str = "raw"
    timeout_s: float = 0.5


@dataclass(frozen=True)
class KVOffloadConfig:
    """KV offload tiers below the device pool: blocks the pool evicts are kept here and loaded back on a hit.

    ``cpu``: a size ("4GiB") or ``{"size", "codec"}``; ``disk``: ``{"path", "size", "codec"}``; ``remote``:
    a ``redis://host:port[/db]`` URL or ``{"url", "codec", "timeout_s"}`` (a store shared by several servers;
    Redis evicts by its own ``maxmemory-policy``). ``codec`` is the default for tiers that name none.
    """

    cpu: Any = None
    disk: Any = None
    remote: Any = None
    codec: str = "raw"

    def __post_init__(self) -> None:
        _check_codec("codec", self.codec)
        if not self.tiers:
            raise ValueError("kv_offload needs at least one tier: 'cpu', 'disk' or 'remote'")

    @cached_property
    def tiers(self) -> tuple[TierConfig, ...]:
        """The configured tiers in search order."""
        parsed = (_cpu(self.cpu, self.codec), _disk(self.disk, self.codec), _remote(self.remote, self.codec))
        return tuple(t for t in parsed if t is not None)


def _options(name: str, value: Any, allowed: tuple[str, ...], shorthand: str) -> dict[str, Any]:
    if isinstance(value, dict):
        unknown = set(value) - set(allowed)
        if unknown:
            raise ValueError(f"kv_offload.{name}: unknown key(s) {sorted(unknown)}; known: {list(allowed)}")
        return dict(value)
    return {shorthand: value}


def _codec(name: str, options: dict[str, Any], default: str) -> str:
    codec = options.get("codec", default)
    _check_codec(f"kv_offload.{name}.codec", codec)
    return codec


def _check_codec(name: str, codec: Any) -> None:
    if codec not in KV_CODECS:
        raise ValueError(f"{name} must be one of {', '.join(KV_CODECS)}, got {codec!r}")


def _size(name: str, value: Any) -> int:
    if value is None:
        raise ValueError(f"kv_offload.{name} needs a 'size' like '4GiB'")
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ValueError(f"kv_offload.{name}: {exc}") from None


def _cpu(value: Any, default_codec: str) -> TierConfig | None:
    if value is None:
        return None
    options = _options("cpu", value, ("size", "codec"), "size")
    return TierConfig("cpu", size_bytes=_size("cpu", options.get("size")), codec=_codec("cpu", options, default_codec))


def _disk(value: Any, default_codec: str) -> TierConfig | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"kv_offload.disk must be an object like {{\"path\": \"/tmp/kv\", \"size\": \"20GiB\"}}, "
                         f"got {value!r}")
    options = _options("disk", value, ("path", "size", "codec"), "path")
    if not isinstance(options.get("path"), str) or not options["path"]:
        raise ValueError("kv_offload.disk needs a 'path' (a folder for the entries)")
    return TierConfig("disk", size_bytes=_size("disk", options.get("size")), path=options["path"],
                      codec=_codec("disk", options, default_codec))


def _remote(value: Any, default_codec: str) -> TierConfig | None:
    if value is None:
        return None
    options = _options("remote", value, ("url", "codec", "timeout_s"), "url")
    url = options.get("url")
    if not isinstance(url, str) or not url.startswith("redis://"):
        raise ValueError(f"kv_offload.remote must be a redis://host:port URL, got {url!r}")
    timeout = options.get("timeout_s", 0.5)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise ValueError(f"kv_offload.remote.timeout_s must be a positive number of seconds, got {timeout!r}")
    return TierConfig("remote", url=url, codec=_codec("remote", options, default_codec), timeout_s=float(timeout))
