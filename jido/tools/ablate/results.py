"""What an ablation measured: medians and spreads over repeats, ratios to the baseline, gains, the order to apply."""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jido.tools.ablate.techniques import STAGES, Technique

# vLLM's result keys (and jido bench's server_* ones) kept from each run; the per-request lists are dropped.
METRICS = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
           "request_goodput", "output_throughput", "total_token_throughput",
           "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
           "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms",
           "server_mean_queue_time_ms", "server_mean_kv_cache_usage", "server_max_kv_cache_usage",
           "server_prefix_cache_hit_rate", "server_num_preemptions", "server_mean_batch_size")
# Where a larger figure is better; for every other metric (latencies, KV usage) a smaller one is.
HIGHER_IS_BETTER = frozenset({"request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                              "server_prefix_cache_hit_rate", "completed", "server_mean_batch_size"})


@dataclass(eq=False)  # one arm is one server configuration: equal only to itself
class Arm:
    """The baseline (``technique`` None) or one technique's value, with the runs of its server."""

    technique: str | None
    value: str
    serve_args: tuple[str, ...]
    runs: list[dict[str, Any]] = field(default_factory=list)  # METRICS of each run that completed
    errors: list[str] = field(default_factory=list)  # runs that did not (timeouts, a server that died)

    @property
    def label(self) -> str:
        return "baseline" if self.technique is None else f"{self.technique}={self.value}"

    def medians(self) -> dict[str, float | None]:
        return {key: median([run.get(key) for run in self.runs]) for key in METRICS}

    def spreads(self) -> dict[str, list[float] | None]:
        """[min, max] of each metric over the runs (None where no run had it)."""
        return {key: spread([run.get(key) for run in self.runs]) for key in METRICS}


@dataclass
class Ablation:
    """The plan (which servers, with which flags) and everything measured so far."""

    techniques: list[Technique]
    baseline: Arm
    variants: list[Arm]
    unavailable: list[dict[str, str]] = field(default_factory=list)  # technique, value, reason
    interrupted: bool = False

    def arms(self) -> dict[tuple[str, str], Arm]:
        """Every measured value by (technique, value); the baseline stands for each technique's baseline value."""
        arms = {(t.name, t.baseline): self.baseline for t in self.techniques}
        arms.update({(a.technique, a.value): a for a in self.variants})
        return arms


def run_metrics(result: Mapping[str, Any]) -> dict[str, Any]:
    """The METRICS of one `jido bench` result."""
    return {key: result.get(key) for key in METRICS}


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values given (None ones left out); None when there are none."""
    known = [v for v in values if v is not None]
    return float(statistics.median(known)) if known else None


def spread(values: Sequence[float | None]) -> list[float] | None:
    known = [v for v in values if v is not None]
    return [float(min(known)), float(max(known))] if known else None


def ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference; None when either is unknown or the reference is 0."""
    if value is None or reference is None or reference == 0:
        return None
    return value / reference


def ratios(medians: Mapping[str, float | None], baseline: Mapping[str, float | None]) -> dict[str, float | None]:
    return {key: ratio(medians.get(key), baseline.get(key)) for key in METRICS}


def default_gain_metric(slos_ms: Mapping[str, float]) -> str:
    """The figure a technique must improve to pay unless told: goodput under the SLOs given, else output
    throughput."""
    return "request_goodput" if slos_ms else "output_throughput"


def gain(arm: Arm, reference: Arm, metric: str) -> float | None:
    """How much better ``arm`` does than ``reference`` on ``metric``: >1 is better, whichever way it points."""
    better = ratio(arm.medians()[metric], reference.medians()[metric])
    if better is None or metric in HIGHER_IS_BETTER:
        return better
    return 1 / better if better else None


def beats(arm: Arm, reference: Arm, metric: str, min_gain: float) -> bool:
    """``arm`` pays over ``reference``: a gain of at least ``min_gain`` on ``metric``, no failed request, and
    (with repeats) its worst run better than the reference's best, so the gain is not noise."""
    if not arm.runs or not reference.runs or any(run.get("failed") for run in arm.runs):
        return False
    value, reference_value = arm.medians()[metric], reference.medians()[metric]
    if value is not None and reference_value == 0:
        return value > 0 and metric in HIGHER_IS_BETTER  # from nothing (no request met the SLOs) to something
    measured = gain(arm, reference, metric)
    if measured is None or measured < 1 + min_gain:
        return False
    ranges = arm.spreads()[metric], reference.spreads()[metric]
    if len(arm.runs) < 2 or len(reference.runs) < 2 or None in ranges:
        return True
    (low, high), (ref_low, ref_high) = ranges
    return low > ref_high if metric in HIGHER_IS_BETTER else high < ref_low


@dataclass(frozen=True)
class Step:
    """One technique to apply: the value that did best, and its gain over the technique off."""

    stage: str
    technique: str
    value: str
    gain: float | None  # None when the technique off scored 0 (goodput from nothing)
    is_baseline: bool  # the baseline (jido's default) already runs this value


def application_order(techniques: Sequence[Technique], arms: Mapping[tuple[str, str], Arm], metric: str,
                      min_gain: float) -> tuple[list[Step], list[Step]]:
    """Which techniques paid, in seed 004's order (STAGES; within a stage, the larger gain first), and which did
    not (their best value and its gain).

    ``arms`` holds every measured value by (technique, value), the baseline's value of each technique under
    its own key. A technique pays when its best value beats the technique off (``beats``).
    """
    paid, unpaid = [], []
    for technique in techniques:
        off = arms.get((technique.name, technique.off.value))
        measured = {s.value: arm for s in technique.values[1:]
                    if (arm := arms.get((technique.name, s.value))) is not None and arm.runs}
        if off is None or not off.runs or not measured:
            continue
        value, best = max(measured.items(), key=lambda item: _rank(item[1], off, metric))
        step = Step(technique.stage, technique.name, value, gain(best, off, metric), value == technique.baseline)
        (paid if beats(best, off, metric, min_gain) else unpaid).append(step)
    stage_rank = {stage: i for i, stage in enumerate(STAGES)}
    paid.sort(key=lambda s: (stage_rank[s.stage], -(s.gain or math.inf)))
    return paid, unpaid


def _rank(arm: Arm, off: Arm, metric: str) -> tuple[float, float]:
    """The gain to sort values by, then the figure itself: something from nothing (off scored 0) ranks above
    any ratio, and the larger something first."""
    value = arm.medians()[metric] or 0.0
    measured = gain(arm, off, metric)
    if measured is None:
        measured = math.inf if value and off.medians()[metric] == 0 and metric in HIGHER_IS_BETTER else 0.0
    return measured, value if metric in HIGHER_IS_BETTER else -value
