"""The planner: size every valid configuration, simulate the finalists, rank them, report the saving."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

from jido.planner.design_space import Config, Enumeration, SearchSpace, enumerate_space
from jido.planner.simulator import ClusterSpec, PoolSpec, SimResult, TransferSpec, simulate
from jido.planner.sizing import PlanInputs, Sizer, Sizing, cost_per_million_tokens
from jido.planner.transfer import LinkPlan
from jido.planner.workloads import sample_trace


@dataclass(frozen=True)
class PlanSettings:
    """How hard the planner works: simulated requests, finalists per family, ratio tries."""

    num_requests: int = 400
    seed: int = 0
    attainment: float = 0.9
    num_finalists: int = 5
    max_ratio_tries: int = 6
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.num_requests < 10:
            raise ValueError(f"num_requests must be >= 10, got {self.num_requests}")
        if not 0 < self.attainment <= 1:
            raise ValueError(f"attainment must be in (0, 1], got {self.attainment}")
        if self.num_finalists < 1 or self.max_ratio_tries < 1:
            raise ValueError("num_finalists and max_ratio_tries must be >= 1")


@dataclass(frozen=True)
class Ranked:
    """A simulated configuration at the cheapest P:D ratio tried that met the SLOs (or the last tried)."""

    sizing: Sizing
    num_prefill: int
    num_decode: int
    cost_per_hour: float
    cost_per_mtok: float
    sim: SimResult
    meets_slo: bool

    @property
    def config(self) -> Config:
        return self.sizing.config

    @property
    def ratio(self) -> str:
        if self.config.placement == "colocated":
            return f"{self.num_prefill} co-located"
        return f"{self.num_prefill}P:{self.num_decode}D"


@dataclass(frozen=True)
class Saving:
    """Best heterogeneous vs best homogeneous cost per token; percent is None when there is no saving."""

    percent: float | None
    heterogeneous: Ranked | None
    homogeneous: Ranked | None
    explanation: str


@dataclass
class PlanResult:
    inputs: PlanInputs
    enumeration: Enumeration
    sizings: list[Sizing]
    ranked: list[Ranked]
    saving: Saving
    infeasible: Counter[str] = field(default_factory=Counter)

    @property
    def feasible_sizings(self) -> list[Sizing]:
        return [s for s in self.sizings if s.feasible]


def plan(inputs: PlanInputs, space: SearchSpace, settings: PlanSettings) -> PlanResult:
    enumeration = enumerate_space(space, inputs.catalog)
    sizer = Sizer(inputs)
    sizings = [sizer.size(c) for c in enumeration.configs]
    feasible = sorted((s for s in sizings if s.feasible), key=_analytic_key)
    ranked = [simulate_best_ratio(inputs, s, settings) for s in pick_finalists(feasible, settings.num_finalists)]
    ranked.sort(key=lambda r: (not r.meets_slo, r.cost_per_mtok, r.sim.ttft_ms["p90"]))
    infeasible = Counter(_reason_kind(s.reason) for s in sizings if not s.feasible)
    return PlanResult(inputs, enumeration, sizings, ranked, heterogeneous_saving(ranked, inputs), infeasible)


def _analytic_key(s: Sizing) -> tuple:
    return (s.cost_per_hour, s.ttft_s, s.config.label)


def _reason_kind(reason: str) -> str:
    """Group reasons that differ only in their figures."""
    return re.sub(r"(?<![\w-])\d[\d.,]*", "N", reason)


def pick_finalists(feasible: list[Sizing], per_family: int) -> list[Sizing]:
    """The cheapest configuration per (placement, prefill, decode accelerator), the top few of each
    family: heterogeneous, homogeneous disaggregated, co-located."""
    best: dict[tuple, Sizing] = {}
    for s in feasible:
        key = (s.config.placement, s.config.prefill.accelerator, s.config.decode.accelerator)
        best.setdefault(key, s)
    families: dict[str, list[Sizing]] = {}
    for s in sorted(best.values(), key=_analytic_key):
        families.setdefault(family(s.config), []).append(s)
    return [s for members in families.values() for s in members[:per_family]]


def family(config: Config) -> str:
    if config.is_heterogeneous:
        return "heterogeneous"
    return "homogeneous co-located" if config.placement == "colocated" else "homogeneous disaggregated"


def build_cluster(inputs: PlanInputs, sizing: Sizing, num_prefill: int, num_decode: int) -> ClusterSpec:
    share = inputs.workload.prefix_share
    if sizing.config.placement == "colocated":  # one pool; its size is carried as num_prefill
        return ClusterSpec(decode=_pool(sizing.decode, num_prefill), prefix_share=share)
    catalog = inputs.catalog
    link_plan = LinkPlan(catalog.link(sizing.config.link), catalog.wire(sizing.config.wire),
                         sizing.config.ownership, inputs.layerwise)

    def kv_transfer(n: int):
        return link_plan.transfer(sizing.prefill, sizing.decode, n, share)

    transfer = TransferSpec(link_s=lambda n: kv_transfer(n).link_s,
                            codec_s=lambda n: kv_transfer(n).encode_s + kv_transfer(n).decode_s,
                            layerwise=inputs.layerwise, num_layers=inputs.model.num_layers)
    return ClusterSpec(decode=_pool(sizing.decode, num_decode), prefill=_pool(sizing.prefill, num_prefill),
                       transfer=transfer,
                       prefix_share=share)


def _pool(instance, num_instances: int) -> PoolSpec:
    return PoolSpec(num_instances, lambda batch: instance.step(batch).time_s, instance.kv_bytes,
                    instance.kv_capacity_bytes)


def simulate_ratio(inputs: PlanInputs, sizing: Sizing, num_prefill: int, num_decode: int,
                   settings: PlanSettings) -> Ranked:
    trace = sample_trace(inputs.workload, settings.num_requests, inputs.rate, settings.seed)
    result = simulate(build_cluster(inputs, sizing, num_prefill, num_decode), trace, inputs.slo,
                      settings.timeout_s)
    cost = _cost_per_hour(sizing, num_prefill, num_decode)
    return Ranked(sizing, num_prefill, num_decode, cost, cost_per_million_tokens(cost, inputs.tokens_per_second),
                  result, result.meets(settings.attainment))


def _cost_per_hour(sizing: Sizing, num_prefill: int, num_decode: int) -> float:
    if sizing.config.placement == "colocated":
        return num_prefill * sizing.prefill.price_per_hour
    return num_prefill * sizing.prefill.price_per_hour + num_decode * sizing.decode.price_per_hour


def ratio_candidates(sizing: Sizing) -> list[tuple[int, int]]:
    """Ratios near the analytic one, cheapest first, so the first that meets the SLOs is the cheapest."""
    p0, d0 = sizing.num_prefill, sizing.num_decode
    if sizing.config.placement == "colocated":
        pairs = [(n, 0) for n in range(max(1, p0 - 1), p0 + 4)]
    else:
        pairs = [(p, d) for p in range(max(1, p0 - 1), p0 + 3) for d in range(max(1, d0 - 1), d0 + 3)]
    return sorted(pairs, key=lambda pd: (_cost_per_hour(sizing, *pd), -pd[0]))


def simulate_best_ratio(inputs: PlanInputs, sizing: Sizing, settings: PlanSettings) -> Ranked:
    last = None
    for num_prefill, num_decode in ratio_candidates(sizing)[: settings.max_ratio_tries]:
        last = simulate_ratio(inputs, sizing, num_prefill, num_decode, settings)
        if last.meets_slo:
            return last
    return last


def heterogeneous_saving(ranked: list[Ranked], inputs: PlanInputs) -> Saving:
    het = next((r for r in ranked if r.meets_slo and r.config.is_heterogeneous), None)
    hom = next((r for r in ranked if r.meets_slo and not r.config.is_heterogeneous), None)
    if het is None or hom is None:
        missing = "heterogeneous" if het is None else "homogeneous"
        return Saving(None, het, hom, f"no saving to report: no {missing} configuration met the SLOs")
    percent = (hom.cost_per_mtok - het.cost_per_mtok) / hom.cost_per_mtok * 100
    why = _phase_costs(het, hom, inputs)
    if percent <= 0:
        if hom.config.placement == "colocated":
            why += "; the co-located pool time-shares each device between phases, so neither idles"
        return Saving(None, het, hom, f"no saving: the best heterogeneous design costs {-percent:.1f}% more per "
                                      f"token than the best homogeneous one; {why}")
    return Saving(percent, het, hom, f"heterogeneous saves {percent:.1f}% per token; {why}")


def _phase_costs(het: Ranked, hom: Ranked, inputs: PlanInputs) -> str:
    def prefill_usd(r: Ranked) -> float:
        tokens_s = inputs.workload.input_mean / r.sizing.prefill_step.time_s
        return r.sizing.prefill.price_per_hour / (tokens_s * 3600) * 1e6

    def decode_usd(r: Ranked) -> float:
        load = r.sizing.decode_load
        tokens_s = max(1.0, load.concurrency) / load.tpot_s
        return r.sizing.decode.price_per_hour / (tokens_s * 3600) * 1e6

    return (f"prefill on {het.config.prefill.accelerator} costs ${prefill_usd(het):.3f} per million prompt "
            f"tokens vs ${prefill_usd(hom):.3f} on {hom.config.prefill.accelerator}; decode on "
            f"{het.config.decode.accelerator} costs ${decode_usd(het):.3f} per million output tokens at its "
            f"batch vs ${decode_usd(hom):.3f} on {hom.config.decode.accelerator}")


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points no other point beats on both cost and latency (lower is better), by cost."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    front, best_latency = [], math.inf
    for i in order:
        if points[i][1] < best_latency:
            front.append(i)
            best_latency = points[i][1]
    return front
