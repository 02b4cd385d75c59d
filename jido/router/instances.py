"""Instances behind the router: their health, load (outstanding tokens) and KV endpoint, and how one is picked."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from jido.utils.prefix_affinity import PrefixAffinity

logger = logging.getLogger("jido")

MAX_HASHES = 1 << 16  # chained prefix hashes remembered per instance, least recently sent dropped first


@dataclass
class Instance:
    """One jido (or any OpenAI-compatible) server as the router sees it."""

    url: str
    role: str  # prefill | decode
    healthy: bool = False
    outstanding_tokens: int = 0  # estimated prompt + max output tokens of the requests in flight there
    num_requests: int = 0  # in flight there
    num_waiting: int = 0  # its vllm:num_requests_waiting at the last health check
    kv_info: dict[str, Any] | None = None  # its GET /kv_transfer: KV endpoint, role, mode, format
    last_error: str = ""
    incompatible: str = ""  # why its KV cannot be exchanged with the other pool (kept out while set)

    @property
    def usable(self) -> bool:
        return self.healthy and not self.incompatible

    @property
    def kv_address(self) -> tuple[str, int] | None:
        """The host and port of its KV endpoint, for a producer to push to."""
        if not self.kv_info or "address" not in self.kv_info:
            return None
        host, port = str(self.kv_info["address"]).removeprefix("tcp://").rsplit(":", 1)
        return host, int(port)


@dataclass
class Pool:
    """The instances of one role, and the prefix affinity learned over them."""

    instances: list[Instance]
    balance_threshold: int
    affinity: PrefixAffinity[str] = field(default_factory=lambda: PrefixAffinity(MAX_HASHES))  # by instance URL

    def usable(self) -> list[Instance]:
        return [i for i in self.instances if i.usable]

    def pick(self, hashes: list[bytes], exclude: tuple[Instance, ...] = ()) -> tuple[Instance | None, str]:
        """The instance for a prompt, and why: ``affinity`` (it was sent the longest shared prefix, the least
        loaded of those that were, and is not loaded past ``balance_threshold`` over the least loaded) or
        ``least_loaded``; (None, "none") if none is usable."""
        by_load = sorted((i for i in self.usable() if i not in exclude),
                         key=lambda i: (i.outstanding_tokens, i.num_requests))
        if not by_load:
            return None, "none"
        owner, _ = self.affinity.longest_match(hashes, [i.url for i in by_load])
        holder = next((i for i in by_load if i.url == owner), None)
        if holder is not None and holder.outstanding_tokens <= by_load[0].outstanding_tokens + self.balance_threshold:
            return holder, "affinity"
        return by_load[0], "least_loaded"

    def start(self, instance: Instance, hashes: list[bytes], num_tokens: int) -> None:
        instance.outstanding_tokens += num_tokens
        instance.num_requests += 1
        self.affinity.record(hashes, instance.url)

    def done(self, instance: Instance, num_tokens: int) -> None:
        instance.outstanding_tokens -= num_tokens
        instance.num_requests -= 1

    def mark_down(self, instance: Instance, error: str) -> None:
        if instance.healthy:
            logger.warning("router: %s instance %s taken out: %s", instance.role, instance.url, error)
        instance.healthy, instance.last_error = False, error
        self.affinity.forget(instance.url)
