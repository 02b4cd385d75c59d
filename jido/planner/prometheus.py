"""Prometheus text exposition read with prometheus_client's parser, with histogram means and quantiles."""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


class MetricsError(ValueError):
    """The metrics text could not be parsed or fetched."""


@dataclass
class Metrics:
    """Samples by metric name, each a list of (labels, value)."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def total(self, name: str) -> float | None:
        """Sum over label sets; counters match with or without their _total suffix."""
        for candidate in (name, f"{name}_total"):
            if candidate in self.samples:
                return sum(v for _, v in self.samples[candidate])
        return None

    def histogram_mean(self, name: str) -> float | None:
        total, count = self.total(f"{name}_sum"), self.total(f"{name}_count")
        if total is None or not count:
            return None
        return total / count

    def histogram_quantile(self, name: str, q: float) -> float | None:
        """Like PromQL histogram_quantile: linear inside the bucket holding rank q * count."""
        buckets = self._buckets(name)
        if not buckets or buckets[-1][1] == 0:
            return None
        rank = q * buckets[-1][1]
        lower_bound, lower_count = 0.0, 0.0
        for bound, count in buckets:
            if count >= rank:
                if math.isinf(bound):
                    return lower_bound
                return lower_bound + (bound - lower_bound) * (rank - lower_count) / max(count - lower_count, 1e-12)
            lower_bound, lower_count = bound, count
        return lower_bound

    def _buckets(self, name: str) -> list[tuple[float, float]]:
        merged: dict[float, float] = {}
        for labels, value in self.samples.get(f"{name}_bucket", []):
            bound = float(labels["le"].replace("Inf", "inf"))
            merged[bound] = merged.get(bound, 0.0) + value
        return sorted(merged.items())


def parse_metrics(text: str) -> Metrics:
    """Every sample by its own name (``x_total``, ``x_bucket``), whatever family the text put it under."""
    metrics = Metrics()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                metrics.samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except (ValueError, IndexError) as exc:
        raise MetricsError(f"not Prometheus text: {exc}") from exc
    return metrics


def fetch_metrics(url: str, timeout_s: float = 5.0) -> Metrics:
    """GET a /metrics endpoint."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return parse_metrics(response.read().decode("utf-8"))
    except OSError as exc:
        raise MetricsError(f"could not fetch {url}: {exc}") from exc
