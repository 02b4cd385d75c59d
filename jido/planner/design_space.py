"""The heterogeneous P/D design space: configurations, their labels, enumeration and pruning with reasons."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

from jido.planner.catalog import PRECISIONS, Catalog
from jido.planner.roofline import Role
from jido.planner.transfer import OWNERSHIPS

PLACEMENTS = ("colocated", "disaggregated")


class ConfigError(ValueError):
    """A configuration label or search-space axis is invalid."""


@dataclass(frozen=True)
class Config:
    """One deployment: a co-located pool, or a prefill pool and a decode pool joined by a link."""

    placement: str
    prefill: Role
    decode: Role
    residency: str = "hbm"
    link: str | None = None
    wire: str | None = None
    ownership: str | None = None

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        kv_path = (self.link, self.wire, self.ownership)
        if self.placement == "disaggregated" and None in kv_path:
            raise ConfigError("a disaggregated config needs link, wire and ownership")
        if self.placement == "colocated" and kv_path != (None, None, None):
            raise ConfigError("a co-located config moves no KV: give no link, wire or ownership")

    @property
    def is_heterogeneous(self) -> bool:
        return self.prefill.accelerator != self.decode.accelerator

    @property
    def label(self) -> str:
        if self.placement == "colocated":
            roles = self.prefill.label if self.prefill == self.decode else f"{self.prefill.label}+{self.decode.label}"
            return f"pool={roles},kv={self.residency}"
        return (f"p={self.prefill.label},d={self.decode.label},link={self.link},"
                f"wire={self.wire},kv={self.residency},own={self.ownership}")

    @classmethod
    def parse(cls, label: str) -> Config:
        """Inverse of `label`; wire, kv and own default to raw, hbm and push."""
        items = dict(_split_item(item) for item in label.split(",") if item)
        if "pool" in items:
            roles = [Role.parse(text) for text in items.pop("pool").split("+", 1)]
            config = cls("colocated", roles[0], roles[-1], items.pop("kv", "hbm"))
        elif {"p", "d", "link"} <= set(items):
            config = cls("disaggregated", Role.parse(items.pop("p")), Role.parse(items.pop("d")),
                         items.pop("kv", "hbm"), items.pop("link"), items.pop("wire", "raw"),
                         items.pop("own", "push"))
        else:
            raise ConfigError(f"config {label!r} needs pool=ROLE, or p=ROLE,d=ROLE,link=LINK")
        if items:
            raise ConfigError(f"config {label!r}: unknown keys {sorted(items)}")
        return config


def _split_item(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep:
        raise ConfigError(f"config item {item!r} must be KEY=VALUE")
    return key.strip(), value.strip()


@dataclass(frozen=True)
class SearchSpace:
    """Values each axis may take; empty accelerators means every catalog entry."""

    accelerators: tuple[str, ...] = ()
    weight_precisions: tuple[str, ...] = PRECISIONS
    kv_precisions: tuple[str, ...] = ("bf16", "fp8")
    links: tuple[str, ...] = ("nvlink", "infiniband", "pcie", "ethernet")
    wires: tuple[str, ...] = ("raw", "quantized", "compressed")
    residencies: tuple[str, ...] = ("hbm", "cpu-dram", "nvme", "remote-pool")
    ownerships: tuple[str, ...] = OWNERSHIPS
    placements: tuple[str, ...] = PLACEMENTS

    def __post_init__(self) -> None:
        for key, allowed in (("weight_precisions", PRECISIONS), ("kv_precisions", PRECISIONS),
                             ("ownerships", OWNERSHIPS), ("placements", PLACEMENTS)):
            bad = set(getattr(self, key)) - set(allowed)
            if bad:
                raise ConfigError(f"{key}: unknown {sorted(bad)}; allowed {allowed}")
            if not getattr(self, key):
                raise ConfigError(f"{key} must not be empty")

    def validate_names(self, catalog: Catalog) -> None:
        for name in self.accelerators:
            catalog.accelerator(name)
        for name in self.links:
            catalog.link(name)
        for name in self.wires:
            catalog.wire(name)
        for name in self.residencies:
            catalog.residency(name)


@dataclass
class Enumeration:
    """Valid configurations, and how many combinations each rule pruned (with one example each)."""

    configs: list[Config] = field(default_factory=list)
    pruned: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def add_pruned(self, reason: str, config: Config) -> None:
        self.pruned[reason] += 1
        self.examples.setdefault(reason, config.label)


Rule = Callable[[Config, Catalog], "str | None"]


def _precision_supported(config: Config, catalog: Catalog) -> str | None:
    for role in (config.prefill, config.decode):
        if not catalog.accelerator(role.accelerator).supports(role.weight_precision):
            return f"{role.accelerator} has no {role.weight_precision} tensor cores"
    return None


def _colocated_single_role(config: Config, catalog: Catalog) -> str | None:
    if config.placement == "colocated" and config.prefill != config.decode:
        return "a co-located pool runs both phases on one accelerator type and precision"
    return None


def _residency_distinct(config: Config, catalog: Catalog) -> str | None:
    device = catalog.accelerator(config.decode.accelerator)
    if device.scaleup_gb_s is None and device.pcie_gb_s is None and config.residency == "cpu-dram":
        return f"{device.name} memory is CPU DRAM already: 'cpu-dram' is the same as 'hbm'"
    return None


def _link_reachable(config: Config, catalog: Catalog) -> str | None:
    if config.placement == "colocated":
        return None
    pair = (catalog.accelerator(config.prefill.accelerator), catalog.accelerator(config.decode.accelerator))
    if config.link == "nvlink":
        if config.is_heterogeneous:
            return "different accelerator types sit on different servers: no shared NVLink domain"
        if pair[0].scaleup_gb_s is None:
            return f"{pair[0].name} has no NVLink-class scale-up link"
    if catalog.link(config.link).same_node and any(a.pcie_gb_s is None for a in pair):
        return "a CPU-only node has no accelerator link: prefill and decode must talk over a network"
    return None


def _wire_useful(config: Config, catalog: Catalog) -> str | None:
    if config.placement == "colocated":
        return None
    if config.wire == "quantized" and config.prefill.kv_precision != "bf16":
        return "KV is already 8-bit at prefill: quantizing for the wire changes nothing"
    codec = catalog.wire(config.wire).codec_gb_s
    pair = (catalog.accelerator(config.prefill.accelerator), catalog.accelerator(config.decode.accelerator))
    link_gb_s = catalog.link(config.link).bandwidth_gb_s(*pair)
    if codec is not None and link_gb_s >= codec:
        return "compression codec is no faster than the link: compressing can only add time"
    return None


RULES: tuple[Rule, ...] = (_precision_supported, _colocated_single_role, _residency_distinct,
                           _link_reachable, _wire_useful)


def prune_reason(config: Config, catalog: Catalog) -> str | None:
    """The first rule that rejects the configuration, or None when it is valid."""
    for rule in RULES:
        reason = rule(config, catalog)
        if reason:
            return reason
    return None


def enumerate_space(space: SearchSpace, catalog: Catalog) -> Enumeration:
    space.validate_names(catalog)
    result = Enumeration()
    for config in _candidates(space, catalog):
        reason = prune_reason(config, catalog)
        if reason:
            result.add_pruned(reason, config)
        else:
            result.configs.append(config)
    return result


def _candidates(space: SearchSpace, catalog: Catalog) -> Iterator[Config]:
    accelerators = space.accelerators or tuple(catalog.accelerators)
    roles = [Role(a, w, k) for a, w, k in itertools.product(accelerators, space.weight_precisions,
                                                            space.kv_precisions)]
    for prefill, decode in itertools.product(roles, roles):
        for residency in space.residencies:
            if "colocated" in space.placements:
                yield Config("colocated", prefill, decode, residency)
            if "disaggregated" not in space.placements:
                continue
            for link, wire, ownership in itertools.product(space.links, space.wires, space.ownerships):
                yield Config("disaggregated", prefill, decode, residency, link, wire, ownership)
