"""`jido plan --calibrate`: fit an accelerator's TP link (per-hop latency, bandwidth) to measured all-reduces,
and keep the fit as an overlay the hardware catalog is read with."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jido.planner.catalog import Catalog

CALIBRATION_PATH = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jido" / "planner-calibration.json"


@dataclass(frozen=True)
class LinkFit:
    """A ring all-reduce model fitted to samples: ``seconds = hops * latency + hops / tp * bytes / bandwidth``."""

    accelerator: str
    tp: int
    latency_us: float
    gb_s: float
    num_samples: int
    max_error: float  # largest |fitted - measured| / measured over the samples

    def predict_s(self, num_bytes: float) -> float:
        hops = 2 * (self.tp - 1)
        return hops * self.latency_us * 1e-6 + hops / self.tp * num_bytes / (self.gb_s * 1e9)


def fit_ring_all_reduce(accelerator: str, tp: int, samples: list[dict[str, float]]) -> LinkFit:
    """Least squares of seconds on bytes over ``samples`` (``{"bytes", "seconds"}`` per all-reduce call).

    Raises:
        ValueError: fewer than two distinct sizes, or a fit without a positive latency and bandwidth.
    """
    if tp < 2:
        raise ValueError(f"a TP link needs tp >= 2, got {tp}")
    sizes = [float(s["bytes"]) for s in samples]
    times = [float(s["seconds"]) for s in samples]
    if len(set(sizes)) < 2:
        raise ValueError("calibration needs all-reduces of at least two sizes (run the benchmark at several batches)")
    mean_x, mean_y = sum(sizes) / len(sizes), sum(times) / len(times)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, times)) / sum((x - mean_x) ** 2 for x in sizes)
    intercept = mean_y - slope * mean_x
    if slope <= 0 or intercept <= 0:
        raise ValueError(f"the samples do not fit latency + bytes / bandwidth (intercept {intercept:.3g} s, slope "
                         f"{slope:.3g} s/B): time does not grow with size; measure larger batches")
    hops = 2 * (tp - 1)
    fit = LinkFit(accelerator, tp, intercept / hops * 1e6, hops / tp / slope / 1e9, len(samples), 0.0)
    error = max(abs(fit.predict_s(x) - y) / y for x, y in zip(sizes, times))
    return dataclasses.replace(fit, max_error=error)


def save_calibration(fit: LinkFit, path: Path = CALIBRATION_PATH) -> None:
    """Add (or replace) ``fit`` in the overlay file."""
    overlay = read_calibration(path)
    overlay[fit.accelerator] = dataclasses.asdict(fit)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(overlay, indent=2) + "\n")


def read_calibration(path: Path = CALIBRATION_PATH) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def apply_calibration(catalog: Catalog, overlay: dict[str, Any]) -> Catalog:
    """The catalog with each calibrated accelerator's TP link, latency and degree replaced by the fit."""
    accelerators = dict(catalog.accelerators)
    for name, fit in overlay.items():
        if name not in accelerators:
            continue
        accelerator = accelerators[name]
        source = {**accelerator.source, "links": f"calibrated: ring all-reduce fitted to {fit['num_samples']} "
                                                 f"measured sizes at TP{fit['tp']} (max error {fit['max_error']:.0%})"}
        accelerators[name] = dataclasses.replace(accelerator, scaleup_gb_s=fit["gb_s"], tp_latency_us=fit["latency_us"],
                                                 max_tp=max(accelerator.max_tp, fit["tp"]), source=source)
    return dataclasses.replace(catalog, accelerators=accelerators)
