"""`jido plan --explain`: the arithmetic behind one configuration, step by step."""

from __future__ import annotations

from dataclasses import dataclass

from jido.planner.catalog import PRECISION_BYTES
from jido.planner.design_space import Config, prune_reason
from jido.planner.parallelism import tp_all_reduces_per_token
from jido.planner.planner import PlanSettings, Ranked, simulate_best_ratio
from jido.planner.roofline import Instance, StepCost
from jido.planner.sizing import PlanInputs, Sizer, Sizing, cost_per_million_tokens


@dataclass(frozen=True)
class Step:
    """One line of working: what is computed, how, and the result."""

    what: str
    how: str
    value: str


@dataclass(frozen=True)
class Explanation:
    config: Config
    steps: list[Step]
    sizing: Sizing | None
    ranked: Ranked | None
    verdict: str


def explain(label: str, inputs: PlanInputs, settings: PlanSettings | None = None) -> Explanation:
    config = Config.parse(label)
    pruned = prune_reason(config, inputs.catalog)
    if pruned:
        return Explanation(config, [], None, None, f"pruned: {pruned}")
    sizing = Sizer(inputs).size(config)
    steps = _model_steps(inputs) + _instance_steps("prefill", sizing.prefill) + _instance_steps("decode", sizing.decode)
    if not sizing.feasible:
        return Explanation(config, steps, sizing, None, f"infeasible: {sizing.reason}")
    steps += _prefill_steps(inputs, sizing) + _decode_steps(inputs, sizing) + _transfer_steps(inputs, sizing)
    steps += _cost_steps(inputs, sizing)
    ranked = simulate_best_ratio(inputs, sizing, settings) if settings else None
    if ranked:
        steps += _sim_steps(ranked)
    ok = ranked.meets_slo if ranked else True
    return Explanation(config, steps, sizing, ranked, "meets the SLOs" if ok else "misses the SLOs")


def _model_steps(inputs: PlanInputs) -> list[Step]:
    m, w = inputs.model, inputs.workload
    return [
        Step("parameters", "layers*(attention + experts*3*hidden*mlp) + embeddings", f"{m.num_params / 1e9:.2f} B"),
        Step("active parameters per token", "layers*(attention + active_experts*3*hidden*mlp)",
             f"{m.num_active_params / 1e9:.2f} B"),
        Step("KV bytes per token (16-bit)",
             f"2 * {m.num_layers} layers * {m.num_kv_heads} kv_heads * {m.head_dim} head_dim * 2 B",
             f"{m.kv_bytes_per_token(2.0):,.0f} B"),
        Step("KV per mean prompt", f"{w.input_mean:.0f} tokens", f"{m.kv_bytes(w.input_mean) / 1e9:.3f} GB"),
    ]


def _instance_steps(phase: str, inst: Instance | None) -> list[Step]:
    if inst is None:
        return [Step(f"{phase} instance", "weights + KV must fit", "does not fit")]
    bpe = PRECISION_BYTES[inst.role.weight_precision]
    return [
        Step(f"{phase} weights", f"{inst.model.num_params / 1e9:.2f} B params * {bpe:g} B",
             f"{inst.weight_bytes / 1e9:.1f} GB"),
        Step(f"{phase} tensor parallel", f"smallest power of two that fits on {inst.accelerator.name} "
             f"({inst.accelerator.memory_gb:g} GB)", f"TP{inst.tp}, "
             f"{tp_all_reduces_per_token(inst.model.num_layers, inst.tp)} all-reduces per step"),
        Step(f"{phase} KV capacity", f"{inst.residency.name}", f"{inst.kv_capacity_bytes / 1e9:.1f} GB"),
    ]


def _roofline(phase: str, cost: StepCost) -> list[Step]:
    return [
        Step(f"{phase} compute time", f"{cost.flops / 1e12:.2f} TFLOP / ({cost.peak_flops / 1e12:.0f} TFLOPS * "
             "efficiency)", f"{cost.compute_s * 1e3:.2f} ms"),
        Step(f"{phase} memory time", f"{cost.device_bytes / 1e9:.2f} GB / ({cost.peak_bytes_s / 1e12:.2f} TB/s * "
             "efficiency) [+ off-device KV]", f"{cost.memory_s * 1e3:.2f} ms"),
        Step(f"{phase} step", "max(compute, memory) + TP all-reduces + overhead",
             f"{cost.time_s * 1e3:.2f} ms, {cost.bound}-bound, compute {cost.compute_utilization:.1%} / "
             f"bandwidth {cost.bandwidth_utilization:.1%} of peak"),
    ]


def _prefill_steps(inputs: PlanInputs, s: Sizing) -> list[Step]:
    return _roofline("prefill (mean prompt)", s.prefill_step)


def _decode_steps(inputs: PlanInputs, s: Sizing) -> list[Step]:
    load = s.decode_load
    return _roofline(f"decode (batch {max(1, round(load.concurrency))})", load.step) + [
        Step("decode concurrency", f"Little's law: rate/instances * {inputs.workload.output_mean:.0f} output "
             "tokens * TPOT", f"{load.concurrency:.1f} sequences, TPOT {load.tpot_s * 1e3:.1f} ms"),
    ]


def _transfer_steps(inputs: PlanInputs, s: Sizing) -> list[Step]:
    if s.transfer is None:
        return [Step("KV transfer", "co-located: KV stays where it was computed", "0")]
    t = s.transfer
    return [
        Step("KV on the wire", f"{t.num_tokens:.0f} tokens, wire format {s.config.wire}",
             f"{t.wire_bytes / 1e9:.3f} GB"),
        Step("KV transfer", f"encode {t.encode_s * 1e3:.2f} + link {t.link_s * 1e3:.2f} + decode "
             f"{t.decode_s * 1e3:.2f} ms", f"exposed {t.exposed_s(s.prefill_step.time_s) * 1e3:.2f} ms"
             f" ({'layer-wise' if t.layerwise else 'whole'})"),
        Step("link bandwidth", f"needed {inputs.rate:g} req/s * wire bytes",
             f"{s.link_needed_gb_s:.2f} GB/s needed vs {s.link_available_gb_s:.1f} GB/s available"),
    ]


def _cost_steps(inputs: PlanInputs, s: Sizing) -> list[Step]:
    return [
        Step("P:D ratio", "fewest instances keeping utilization < 90% and the estimated SLOs", s.ratio),
        Step("estimated TTFT", "prefill + M/D/1 queueing + exposed transfer + first decode step",
             f"{s.ttft_s * 1e3:.0f} ms"),
        Step("cost", "instances * TP * price per accelerator-hour",
             f"${s.cost_per_hour:.2f}/h = ${cost_per_million_tokens(s.cost_per_hour, inputs.tokens_per_second):.4f}"
             " per million tokens"),
    ]


def _sim_steps(r: Ranked) -> list[Step]:
    return [Step("simulated", f"{r.sim.num_requests} requests at {r.ratio}",
                 f"TTFT p90 {r.sim.ttft_ms['p90']:.0f} ms, TPOT p90 {r.sim.tpot_ms['p90']:.1f} ms, "
                 f"SLO attainment {r.sim.slo_attainment:.1%}, ${r.cost_per_mtok:.4f} per million tokens")]
