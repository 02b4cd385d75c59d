"""Render plan and explain results as JSON-ready dicts and as text tables."""

from __future__ import annotations

import math
from typing import Any

from jido.planner.explain import Explanation
from jido.planner.planner import PlanResult, Ranked, family
from jido.planner.roofline import StepCost


def finite(value: float) -> float | None:
    """JSON has no infinity: a timed-out percentile becomes null."""
    return value if math.isfinite(value) else None


def _utilization(cost: StepCost | None) -> dict[str, Any] | None:
    if cost is None:
        return None
    return {"time_ms": cost.time_s * 1e3, "bound": cost.bound,
            "compute": cost.compute_utilization, "bandwidth": cost.bandwidth_utilization}


def ranked_to_dict(rank: int, r: Ranked) -> dict[str, Any]:
    s = r.sizing
    return {
        "rank": rank, "config": r.config.label, "family": family(r.config),
        "heterogeneous": r.config.is_heterogeneous, "placement": r.config.placement,
        "ratio": r.ratio, "num_prefill": r.num_prefill, "num_decode": r.num_decode,
        "tp": {"prefill": s.prefill.tp, "decode": s.decode.tp},
        "cost_per_hour": r.cost_per_hour, "cost_per_mtok": r.cost_per_mtok,
        "ttft_ms": {k: finite(v) for k, v in r.sim.ttft_ms.items()},
        "tpot_ms": {k: finite(v) for k, v in r.sim.tpot_ms.items()},
        "slo_attainment": r.sim.slo_attainment, "goodput_rps": r.sim.goodput_rps,
        "num_timed_out": r.sim.num_timed_out, "meets_slo": r.meets_slo,
        "link_needed_gb_s": s.link_needed_gb_s, "link_available_gb_s": s.link_available_gb_s,
        "prefill_utilization": _utilization(s.prefill_step),
        "decode_utilization": _utilization(s.decode_load.step if s.decode_load else None),
    }


def plan_to_dict(result: PlanResult, pareto_png: str | None = None) -> dict[str, Any]:
    inputs, enum, saving = result.inputs, result.enumeration, result.saving
    return {
        "model": inputs.model.name, "workload": inputs.workload.name, "workload_kind": inputs.workload.kind,
        "rate": inputs.rate, "slo": {"ttft_ms": inputs.slo.ttft_ms, "tpot_ms": inputs.slo.tpot_ms},
        "kv_bytes_per_token": inputs.model.kv_bytes_per_token(2.0),
        "kv_bytes_per_request": inputs.model.kv_bytes(inputs.workload.input_mean),
        "search": {
            "valid": len(enum.configs), "pruned_total": sum(enum.pruned.values()),
            "pruned": [{"reason": k, "count": n, "example": enum.examples[k]} for k, n in enum.pruned.most_common()],
            "feasible": len(result.feasible_sizings),
            "infeasible": [{"reason": k, "count": n} for k, n in result.infeasible.most_common()],
        },
        "configurations": [ranked_to_dict(i + 1, r) for i, r in enumerate(result.ranked)],
        "saving": {
            "percent": saving.percent, "explanation": saving.explanation,
            "heterogeneous": saving.heterogeneous.config.label if saving.heterogeneous else None,
            "homogeneous": saving.homogeneous.config.label if saving.homogeneous else None,
        },
        "pareto_png": pareto_png,
    }


def _ms(value: float | None) -> str:
    return "timeout" if value is None else f"{value:.0f}"


def format_plan(data: dict[str, Any]) -> str:
    lines = [
        f"{data['model']} / {data['workload']} ({data['workload_kind']}) at {data['rate']:g} req/s, "
        f"SLO TTFT p90 <= {data['slo']['ttft_ms']:g} ms, TPOT p90 <= {data['slo']['tpot_ms']:g} ms",
        f"KV: {data['kv_bytes_per_token']:,.0f} B/token, {data['kv_bytes_per_request'] / 1e9:.3f} GB per mean prompt",
        f"design space: {data['search']['valid']} valid, {data['search']['pruned_total']} pruned, "
        f"{data['search']['feasible']} feasible by the analytic model",
        "",
        f"{'#':>2} {'family':<26} {'P:D':<14} {'$/h':>7} {'$/Mtok':>8} {'TTFT90':>8} {'TPOT90':>7} {'SLO%':>5}  config",
    ]
    for c in data["configurations"]:
        lines.append(f"{c['rank']:>2} {c['family']:<26} {c['ratio']:<14} {c['cost_per_hour']:>7.2f} "
                     f"{c['cost_per_mtok']:>8.4f} {_ms(c['ttft_ms']['p90']):>8} {_ms(c['tpot_ms']['p90']):>7} "
                     f"{c['slo_attainment'] * 100:>5.1f}  {c['config']}{'' if c['meets_slo'] else '  (misses SLO)'}")
    lines += ["", data["saving"]["explanation"], "", "pruned combinations:"]
    lines += [f"  {p['count']:>7}  {p['reason']}" for p in data["search"]["pruned"]]
    lines += ["infeasible configurations:"]
    lines += [f"  {p['count']:>7}  {p['reason']}" for p in data["search"]["infeasible"][:8]]
    if data["pareto_png"]:
        lines.append(f"Pareto plot: {data['pareto_png']}")
    return "\n".join(lines)


def explanation_to_dict(e: Explanation) -> dict[str, Any]:
    data: dict[str, Any] = {"config": e.config.label, "verdict": e.verdict,
                            "steps": [{"what": s.what, "how": s.how, "value": s.value} for s in e.steps]}
    if e.ranked:
        data["simulated"] = ranked_to_dict(1, e.ranked)
    return data


def format_explanation(data: dict[str, Any]) -> str:
    lines = [data["config"]]
    for i, s in enumerate(data["steps"], 1):
        lines.append(f"{i:>2}. {s['what']}: {s['how']} = {s['value']}")
    lines.append(f"verdict: {data['verdict']}")
    return "\n".join(lines)
