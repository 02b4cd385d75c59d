"""Hardware catalog: accelerators, links and KV residency tiers, loaded from data/hardware.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

DATA_PATH = Path(__file__).parent / "data" / "hardware.json"
PRECISIONS = ("bf16", "fp8", "int8")
PRECISION_BYTES = {"bf16": 2.0, "fp8": 1.0, "int8": 1.0}
SOURCE_KEYS = ("tflops", "memory", "links", "price")


class CatalogError(ValueError):
    """The hardware data file, or a user override of it, is malformed."""


@dataclass(frozen=True)
class Accelerator:
    """One accelerator type; every figure is per device, bandwidths one direction."""

    name: str
    tflops: Mapping[str, float]
    memory_gb: float
    memory_tb_s: float
    scaleup_gb_s: float | None
    pcie_gb_s: float | None
    max_tp: int
    price_per_hour: float
    source: Mapping[str, str] = field(default_factory=dict)
    tp_latency_us: float = 5.0  # per hop of a TP collective; `jido plan --calibrate` fits it (and the link) to a run

    def __post_init__(self) -> None:
        unknown = set(self.tflops) - set(PRECISIONS)
        if unknown:
            raise CatalogError(f"{self.name}: unknown precision(s) {sorted(unknown)}; allowed {PRECISIONS}")
        if "bf16" not in self.tflops:
            raise CatalogError(f"{self.name}: tflops must include bf16")
        for key in ("memory_gb", "memory_tb_s", "price_per_hour"):
            if getattr(self, key) <= 0:
                raise CatalogError(f"{self.name}: {key} must be > 0, got {getattr(self, key)}")
        if self.max_tp not in (1, 2, 4, 8):
            raise CatalogError(f"{self.name}: max_tp must be 1, 2, 4 or 8, got {self.max_tp}")
        missing = [k for k in SOURCE_KEYS if not self.source.get(k)]
        if missing:
            raise CatalogError(f"{self.name}: every figure needs a source; missing {missing}")

    def __hash__(self) -> int:  # the tflops mapping is not hashable; names are unique in a catalog
        return hash(self.name)

    def supports(self, precision: str) -> bool:
        return precision in self.tflops

    @property
    def tp_link_gb_s(self) -> float:
        """Bandwidth tensor-parallel collectives use: the scale-up link, else PCIe."""
        return self.scaleup_gb_s or self.pcie_gb_s or 0.0


@dataclass(frozen=True)
class Link:
    """An interconnect between the prefill and decode pools."""

    name: str
    gb_s: float | None
    latency_us: float
    same_node: bool
    source: str

    def __post_init__(self) -> None:
        if self.gb_s is not None and self.gb_s <= 0:
            raise CatalogError(f"link {self.name}: gb_s must be > 0 or null, got {self.gb_s}")
        if not self.source:
            raise CatalogError(f"link {self.name}: needs a source")

    def bandwidth_gb_s(self, a: Accelerator, b: Accelerator) -> float:
        """One-direction bandwidth between an accelerator of type a and one of type b."""
        if self.gb_s is not None:
            return self.gb_s
        return min(a.scaleup_gb_s or 0.0, b.scaleup_gb_s or 0.0)


@dataclass(frozen=True)
class Residency:
    """Where the decode pool keeps its KV cache."""

    name: str
    gb_s: float | None
    capacity_gb: float | None
    latency_us: float
    source: str

    def __post_init__(self) -> None:
        if (self.gb_s is None) != (self.capacity_gb is None):
            raise CatalogError(f"residency {self.name}: gb_s and capacity_gb are both null (device) or both set")
        if not self.source:
            raise CatalogError(f"residency {self.name}: needs a source")

    @property
    def on_device(self) -> bool:
        return self.gb_s is None


@dataclass(frozen=True)
class WireFormat:
    """How KV travels from prefill to decode: ratio of the stored size (None: 8 bits/element)."""

    name: str
    ratio: float | None
    codec_gb_s: float | None
    source: str

    def __post_init__(self) -> None:
        if self.ratio is not None and not 0 < self.ratio <= 1:
            raise CatalogError(f"wire {self.name}: ratio must be in (0, 1] or null, got {self.ratio}")
        if not self.source:
            raise CatalogError(f"wire {self.name}: needs a source")


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak a real engine achieves, and per-step overhead."""

    compute: float
    bandwidth: float
    step_overhead_ms: float
    usable_memory_fraction: float
    source: str

    def __post_init__(self) -> None:
        for key in ("compute", "bandwidth", "usable_memory_fraction"):
            if not 0 < getattr(self, key) <= 1:
                raise CatalogError(f"efficiency.{key} must be in (0, 1], got {getattr(self, key)}")
        if self.step_overhead_ms < 0:
            raise CatalogError(f"efficiency.step_overhead_ms must be >= 0, got {self.step_overhead_ms}")


@dataclass(frozen=True)
class Catalog:
    accelerators: Mapping[str, Accelerator]
    links: Mapping[str, Link]
    residencies: Mapping[str, Residency]
    wire_formats: Mapping[str, WireFormat]
    efficiency: Efficiency

    def accelerator(self, name: str) -> Accelerator:
        return _lookup(self.accelerators, name, "accelerator")

    def link(self, name: str) -> Link:
        return _lookup(self.links, name, "link")

    def residency(self, name: str) -> Residency:
        return _lookup(self.residencies, name, "KV residency")

    def wire(self, name: str) -> WireFormat:
        return _lookup(self.wire_formats, name, "wire format")

    def with_prices(self, prices: Mapping[str, float]) -> Catalog:
        """A copy with user-supplied hourly prices replacing the catalog's."""
        accelerators = dict(self.accelerators)
        for name, price in prices.items():
            accelerators[name] = replace(self.accelerator(name), price_per_hour=price)
        return replace(self, accelerators=accelerators)


    def with_calibration(self, data: Mapping[str, Any]) -> Catalog:
        """A copy with measured links and wire formats (``jido plan --calibrate FILE``) added to, or replacing,
        the catalog's: ``{"links": {name: {gb_s, latency_us, same_node, source}}, "wire": {name: {ratio,
        codec_gb_s, source}}}``, as ``benchmarks/disagg_transfer.py`` writes under ``calibration``."""
        unknown = set(data) - {"links", "wire"}
        if unknown:
            raise CatalogError(f"calibration: unknown section(s) {sorted(unknown)}; known: links, wire")
        try:
            links = {**self.links, **{n: Link(name=n, **v) for n, v in data.get("links", {}).items()}}
            wires = {**self.wire_formats, **{n: WireFormat(name=n, **v) for n, v in data.get("wire", {}).items()}}
        except TypeError as exc:
            raise CatalogError(f"calibration: malformed entry: {exc}") from exc
        return replace(self, links=links, wire_formats=wires)


def _lookup(table: Mapping[str, Any], name: str, what: str) -> Any:
    if name not in table:
        raise CatalogError(f"unknown {what} {name!r}; known: {', '.join(table)}")
    return table[name]


def load_catalog(path: Path | str = DATA_PATH) -> Catalog:
    """Read and validate the hardware data file (nothing is measured at import or load)."""
    raw = json.loads(Path(path).read_text())
    try:
        return Catalog(
            accelerators={n: Accelerator(name=n, **v) for n, v in raw["accelerators"].items()},
            links={n: Link(name=n, **v) for n, v in raw["links"].items()},
            residencies={n: Residency(name=n, **v) for n, v in raw["residency"].items()},
            wire_formats={n: WireFormat(name=n, **v) for n, v in raw["wire"].items()},
            efficiency=Efficiency(**raw["efficiency"]),
        )
    except (KeyError, TypeError) as exc:
        raise CatalogError(f"{path}: malformed hardware catalog: {exc}") from exc
