"""Instances behind the router: their health, load (outstanding tokens) and KV endpoint, and how one is picked."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from jido.router.affinity import PrefixAffinity

logger = logging.getLogger("jido")


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
    affinity: PrefixAffinity = field(default_factory=PrefixAffinity)

    def usable(self) -> list[Instance]:
        return [i for i in self.instances if i.usable]

    def pick(self, hashes: list[bytes], exclude: tuple[Instance, ...] = ()) -> tuple[Instance | None, str]:
        """The instance for a prompt, and why: ``affinity`` (it served the longest shared prefix and is not
        loaded past ``balance_threshold`` over the least loaded) or ``least_loaded``; (None, "none") if none
        is usable."""
        candidates = [i for i in self.usable() if i not in exclude]
        if not candidates:
            return None, "none"
        least = min(candidates, key=lambda i: (i.outstanding_tokens, i.num_requests))
        by_url = {i.url: i for i in candidates}
        owner, length = self.affinity.longest_match(hashes, set(by_url))
        if owner is not None and length > 0:
            holder = by_url[owner]
            if holder.outstanding_tokens <= least.outstanding_tokens + self.balance_threshold:
                return holder, "affinity"
        return least, "least_loaded"

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
