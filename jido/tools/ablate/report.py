"""An ablation's results as JSON (vLLM's metric keys), the terminal table, the doctor's reading and the order."""
from __future__ import annotations

import dataclasses
from typing import Any

from jido.bench.config import BenchConfig
from jido.bench.machine import describe_machine
from jido.planner.doctor import DEFAULT_SLO, diagnose, findings_to_dict, format_findings, observations_from_bench
from jido.planner.workloads import Slo
from jido.tools.ablate.config import AblateConfig
from jido.tools.ablate.results import Ablation, Arm, Step, application_order, default_gain_metric, gain, ratios
from jido.tools.ablate.techniques import STAGES

# The table's (and the plot's) columns: metric key, title.
COLUMNS = (("output_throughput", "out tok/s"), ("median_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"),
           ("median_tpot_ms", "TPOT p50"), ("p99_tpot_ms", "TPOT p99"), ("request_goodput", "goodput"),
           ("server_max_kv_cache_usage", "peak KV"))
_METRIC_NAMES = {"output_throughput": "output throughput", "request_goodput": "goodput"}


@dataclasses.dataclass(frozen=True)
class Summary:
    """What the measurements say: the figure gains are read on, what paid in order, what did not, the doctor."""

    metric: str
    paid: list[Step]
    unpaid: list[Step]
    doctor: dict[str, Any] | None  # None until the baseline has a run


def summarize(ablation: Ablation, bench: BenchConfig, config: AblateConfig) -> Summary:
    metric = config.gain_metric or default_gain_metric(bench.slos_ms)
    paid, unpaid = application_order(ablation.techniques, ablation.arms(), metric, config.min_gain)
    doctor = None
    if ablation.baseline.runs:
        slo = Slo(bench.slos_ms.get("ttft", DEFAULT_SLO.ttft_ms), bench.slos_ms.get("tpot", DEFAULT_SLO.tpot_ms))
        observations = observations_from_bench(ablation.baseline.medians())
        doctor = findings_to_dict(observations, diagnose(observations, slo), slo)
    return Summary(metric, paid, unpaid, doctor)


def to_json(ablation: Ablation, summary: Summary, header: dict[str, Any]) -> dict[str, Any]:
    """``{"baseline": {...metrics}, "variants": [{"technique", "value", "metrics", "ratios", ...}],
    "unavailable": [...]}`` with the run's header, the spreads and every run, the doctor and the order."""
    baseline = ablation.baseline.medians()
    variants = []
    for arm in ablation.variants:
        technique = next(t for t in ablation.techniques if t.name == arm.technique)
        off = ablation.arms()[(technique.name, technique.off.value)]
        medians = arm.medians()
        variants.append({"technique": arm.technique, "value": arm.value, "serve_args": list(arm.serve_args),
                         "metrics": medians, "ratios": ratios(medians, baseline),
                         "gain_over_off": None if arm is off else gain(arm, off, summary.metric),
                         "spread": arm.spreads(), "runs": arm.runs, "errors": arm.errors})
    return {**header, "baseline": baseline, "baseline_serve_args": list(ablation.baseline.serve_args),
            "baseline_spread": ablation.baseline.spreads(), "baseline_runs": ablation.baseline.runs,
            "baseline_errors": ablation.baseline.errors, "variants": variants, "unavailable": ablation.unavailable,
            "gain_metric": summary.metric, "doctor": summary.doctor,
            "order": [_step_json(s, summary.metric) for s in summary.paid],
            "not_paid": [_step_json(s, summary.metric) for s in summary.unpaid],
            "interrupted": ablation.interrupted}


def _step_json(step: Step, metric: str) -> dict[str, Any]:
    return {**dataclasses.asdict(step), "metric": metric}


def format_table(ablation: Ablation) -> str:
    """One row per server configuration: output tok/s with its range, then each column as a ratio to the
    baseline (the baseline's row in its own units)."""
    baseline = ablation.baseline.medians()
    head = f"{'technique':<24}{'value':<12}{'out tok/s (min-max)':>22}" + "".join(f"{t:>11}" for _, t in COLUMNS)
    rows = [head, _row(ablation.baseline, [_absolute(key, baseline.get(key)) for key, _ in COLUMNS])]
    for arm in ablation.variants:
        cells = ratios(arm.medians(), baseline)
        rows.append(_row(arm, [_times(cells[key]) if arm.runs else "-" for key, _ in COLUMNS]))
    rows.append("ratios are variant / baseline: above 1 is better for tok/s and goodput, below 1 for latencies "
                "and KV usage")
    rows += [f"{arm.label}: {len(arm.errors)} run(s) failed: {arm.errors[0]}"
             for arm in (ablation.baseline, *ablation.variants) if arm.errors]
    rows += [f"{arm.label}: {failed} request(s) failed" for arm in (ablation.baseline, *ablation.variants)
             if (failed := sum(run.get("failed") or 0 for run in arm.runs))]
    return "\n".join(rows)


def _row(arm: Arm, cells: list[str]) -> str:
    medians, spreads = arm.medians(), arm.spreads()
    value, low_high = medians["output_throughput"], spreads["output_throughput"]
    throughput = "-" if value is None else f"{value:.1f} ({low_high[0]:.1f}-{low_high[1]:.1f})"
    technique = arm.technique or "baseline"
    return f"{technique:<24}{'' if arm.technique is None else arm.value:<12}{throughput:>22}" + "".join(
        f"{c:>11}" for c in cells)


def _absolute(key: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    if key.endswith("_ms"):
        return f"{value:.0f} ms" if value >= 100 else f"{value:.1f} ms"
    if key == "server_max_kv_cache_usage":
        return f"{value:.1%}"
    return f"{value:.2f}" if key == "request_goodput" else f"{value:.1f}"


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def format_doctor(summary: Summary) -> str:
    if summary.doctor is None:
        return "The doctor has no reading: the baseline completed no run."
    slo = summary.doctor["slo"]
    return (f"The doctor's reading of the baseline (SLO ttft={slo['ttft_ms']:g} ms, tpot={slo['tpot_ms']:g} ms):\n"
            + format_findings(summary.doctor))


def format_order(ablation: Ablation, summary: Summary, min_gain: float) -> str:
    """seed 004's order of application with the measured gain of each technique that paid."""
    name = _METRIC_NAMES.get(summary.metric, summary.metric)
    lines = [f"Order to apply what paid ({' -> '.join(['measure', *STAGES.values()])}), with each one's gain in "
             f"{name} over the technique off (times better):"]
    baseline = ablation.baseline.medians().get(summary.metric)
    lines.append(f"  0. measure: the baseline, {'n/a' if baseline is None else f'{baseline:.2f}'} {name}")
    for number, (stage, title) in enumerate(STAGES.items(), start=1):
        steps = [_step_text(s, ablation) for s in summary.paid if s.stage == stage]
        lines.append(f"  {number}. {title}: {', '.join(steps) or 'nothing paid'}")
    if summary.unpaid:
        lines.append(f"Did not pay (under {min_gain:.0%}, within the spread of the runs, or with failed requests): "
                     + ", ".join(f"{s.technique}={s.value} {_times(s.gain)}" for s in summary.unpaid))
    if ablation.unavailable:
        lines.append("Unavailable: " + "; ".join(f"{u['technique']}={u['value']} ({u['reason']})"
                                                 for u in ablation.unavailable))
    return "\n".join(lines)


def _step_text(step: Step, ablation: Ablation) -> str:
    gained = "from nothing" if step.gain is None else _times(step.gain)
    technique = next(t for t in ablation.techniques if t.name == step.technique)
    default = "jido's default" if step.is_baseline else f"jido's default is {technique.baseline}"
    return f"{step.technique}={step.value} {gained} ({default})"


def format_report(ablation: Ablation, summary: Summary, min_gain: float, machine: dict[str, Any]) -> str:
    return "\n\n".join([format_table(ablation), format_doctor(summary), format_order(ablation, summary, min_gain),
                        f"Machine: {describe_machine(machine)}"])
