"""Analytic sizing of one configuration: instance shapes, decode batch, queueing, P:D ratio and cost."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from jido.planner.catalog import Catalog
from jido.planner.design_space import Config
from jido.planner.model_shapes import ModelShape
from jido.planner.roofline import Instance, Role, StepBatch, StepCost, build_instance
from jido.planner.transfer import KVTransfer, LinkPlan, required_link_gb_s
from jido.planner.workloads import Slo, Workload

MAX_INSTANCES = 64
MAX_UTILIZATION = 0.9  # keep queues finite: size every pool to at most 90% busy
SLO_HEADROOM = 0.9  # analytic estimates aim under the SLO; the simulator checks percentiles
MIN_DECODE_SEQS = 4


@dataclass(frozen=True)
class PlanInputs:
    """What every configuration is sized against."""

    model: ModelShape
    workload: Workload
    slo: Slo
    rate: float
    catalog: Catalog
    layerwise: bool = True
    min_tp: int = 1  # explain a degree the sizing would not pick (`jido plan --explain ... --tensor-parallel-size`)

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")

    @property
    def context_len(self) -> float:
        """Mean KV length over a request's decode: the prompt plus half its output."""
        return self.workload.input_mean + self.workload.output_mean / 2

    @property
    def tokens_per_second(self) -> float:
        return self.rate * (self.workload.input_mean + self.workload.output_mean)


@dataclass(frozen=True)
class DecodeLoad:
    """Steady state of a decode pool instance: Little's law concurrency and the step it produces."""

    num_instances: int
    concurrency: float
    tpot_s: float
    step: StepCost


@dataclass(frozen=True)
class Sizing:
    """The analytic verdict on one configuration; reason is empty when feasible."""

    config: Config
    reason: str = ""
    prefill: Instance | None = None
    decode: Instance | None = None
    num_prefill: int = 0
    num_decode: int = 0
    prefill_step: StepCost | None = None
    decode_load: DecodeLoad | None = None
    transfer: KVTransfer | None = None
    ttft_s: float = math.inf
    link_needed_gb_s: float = 0.0
    link_available_gb_s: float = 0.0
    cost_per_hour: float = math.inf

    @property
    def feasible(self) -> bool:
        return not self.reason

    @property
    def ratio(self) -> str:
        if self.config.placement == "colocated":
            return f"{self.num_prefill} co-located"
        return f"{self.num_prefill}P:{self.num_decode}D"


class Sizer:
    """Sizes configurations, caching the per-role work that many configurations share."""

    def __init__(self, inputs: PlanInputs) -> None:
        self.inputs = inputs
        self._instance = lru_cache(maxsize=None)(self._build_instance)
        self._prefill_step = lru_cache(maxsize=None)(self._prefill_step_uncached)
        self._decode_pool = lru_cache(maxsize=None)(self._decode_pool_uncached)

    def size(self, config: Config) -> Sizing:
        if config.placement == "colocated":
            return self._size_colocated(config)
        return self._size_disaggregated(config)

    def instance(self, role: Role, residency: str, min_kv_tokens: int) -> Instance | None:
        return self._instance(role, residency, min_kv_tokens)

    def _build_instance(self, role: Role, residency: str, min_kv_tokens: int) -> Instance | None:
        catalog = self.inputs.catalog
        return build_instance(self.inputs.model, role, catalog.accelerator(role.accelerator),
                              catalog.residency(residency), catalog.efficiency, min_kv_tokens, self.inputs.min_tp)

    def _decode_min_tokens(self) -> int:
        w = self.inputs.workload
        return math.ceil(MIN_DECODE_SEQS * (w.input_mean + w.output_mean))

    def _prefill_step_uncached(self, instance: Instance) -> StepCost:
        w = self.inputs.workload
        cached = round(w.input_mean * w.prefix_share)
        return instance.step(StepBatch.prefill(round(w.input_mean) - cached, cached))

    def _size_disaggregated(self, config: Config) -> Sizing:
        w = self.inputs.workload
        prefill = self.instance(config.prefill, "hbm", math.ceil(w.input_mean))
        decode = self.instance(config.decode, config.residency, self._decode_min_tokens())
        if prefill is None or decode is None:
            role = config.prefill if prefill is None else config.decode
            return Sizing(config, f"{role.accelerator} cannot hold the {role.weight_precision} weights "
                                  f"plus KV for a few requests even at TP{role_max_tp(self.inputs.catalog, role)}")
        pool = self._decode_pool(decode)
        if isinstance(pool, str):
            return Sizing(config, pool, prefill, decode)
        plan = LinkPlan(self.inputs.catalog.link(config.link), self.inputs.catalog.wire(config.wire),
                        config.ownership, self.inputs.layerwise)
        transfer = plan.transfer(prefill, decode, w.input_mean, w.prefix_share)
        step = self._prefill_step(prefill)
        fixed_s = step.time_s + transfer.exposed_s(step.time_s) + pool.tpot_s
        base = Sizing(config, "", prefill, decode, 0, pool.num_instances, step, pool, transfer,
                      link_needed_gb_s=required_link_gb_s(transfer.wire_bytes, self.inputs.rate))
        num_prefill = self._num_prefill(step.time_s, fixed_s, transfer.link_s, plan.link_gb_s(prefill, decode),
                                        base.link_needed_gb_s)
        if isinstance(num_prefill, str):
            return replace(base, reason=num_prefill)
        return replace(
            base, num_prefill=num_prefill,
            ttft_s=fixed_s + _md1_wait(self.inputs.rate / num_prefill, step.time_s),
            link_available_gb_s=num_prefill * plan.link_gb_s(prefill, decode),
            cost_per_hour=num_prefill * prefill.price_per_hour + pool.num_instances * decode.price_per_hour,
        )

    def _num_prefill(self, service_s: float, fixed_s: float, link_s: float, link_gb_s: float,
                     needed_gb_s: float) -> int | str:
        """Fewest prefill instances keeping queueing, the link and TTFT within bounds."""
        ttft_target = self.inputs.slo.ttft_ms * 1e-3 * SLO_HEADROOM
        if fixed_s > ttft_target:
            return (f"prefill {service_s * 1e3:.0f} ms + KV transfer + first decode step = "
                    f"{fixed_s * 1e3:.0f} ms already exceeds the TTFT SLO {self.inputs.slo.ttft_ms:.0f} ms")
        for n in range(1, MAX_INSTANCES + 1):
            per_instance = self.inputs.rate / n
            busy = max(per_instance * service_s, per_instance * link_s)
            link_ok = needed_gb_s <= MAX_UTILIZATION * n * link_gb_s
            if busy < MAX_UTILIZATION and link_ok and fixed_s + _md1_wait(per_instance, service_s) <= ttft_target:
                return n
        return f"needs more than {MAX_INSTANCES} prefill instances to meet the TTFT SLO at this rate"

    def _decode_pool_uncached(self, decode: Instance) -> DecodeLoad | str:
        tpot_target = self.inputs.slo.tpot_ms * 1e-3 * SLO_HEADROOM
        first = decode.step(StepBatch.decode(1, self.inputs.context_len))
        if first.time_s > tpot_target:
            return (f"one decode step on {decode.role.accelerator} takes {first.time_s * 1e3:.1f} ms even at "
                    f"batch 1 ({first.bound}-bound), over the TPOT SLO {self.inputs.slo.tpot_ms:.0f} ms")
        for n in range(1, MAX_INSTANCES + 1):
            load = self._decode_load(decode, self.inputs.rate / n, stall=0.0)
            if load is not None and load.tpot_s <= tpot_target:
                return DecodeLoad(n, load.concurrency, load.tpot_s, load.step)
        return f"needs more than {MAX_INSTANCES} decode instances to meet the TPOT SLO at this rate"

    def _decode_load(self, decode: Instance, arrival_rate: float, stall: float) -> DecodeLoad | None:
        """Solve concurrency = rate * output_len * tpot with tpot = step(concurrency) / (1 - stall)."""
        w = self.inputs.workload
        max_seqs = decode.kv_capacity_bytes / decode.kv_bytes(w.input_mean + w.output_mean)
        tpot = 0.0
        for _ in range(100):
            concurrency = arrival_rate * w.output_mean * tpot
            if concurrency > max_seqs:
                return None
            step = decode.step(StepBatch.decode(max(1, math.ceil(concurrency)), self.inputs.context_len))
            new_tpot = step.time_s / (1 - stall)
            if abs(new_tpot - tpot) <= 1e-4 * new_tpot:
                return DecodeLoad(1, concurrency, new_tpot, step)
            tpot = new_tpot
        return None

    def _size_colocated(self, config: Config) -> Sizing:
        instance = self.instance(config.prefill, config.residency, self._decode_min_tokens())
        if instance is None:
            return Sizing(config, f"{config.prefill.accelerator} cannot hold the weights plus KV for a few "
                                  f"requests even at TP{role_max_tp(self.inputs.catalog, config.prefill)}")
        step = self._prefill_step(instance)
        slo = self.inputs.slo
        for n in range(1, MAX_INSTANCES + 1):
            per_instance = self.inputs.rate / n
            stall = per_instance * step.time_s  # fraction of time spent in prefill chunks
            if stall >= MAX_UTILIZATION:
                continue
            load = self._decode_load(instance, per_instance, stall)
            if load is None or load.tpot_s > slo.tpot_ms * 1e-3 * SLO_HEADROOM:
                continue
            # a prompt's chunks ride along with decode steps, and prompts queue behind each other
            ttft = step.time_s + load.step.time_s + _md1_wait(per_instance, step.time_s)
            if ttft <= slo.ttft_ms * 1e-3 * SLO_HEADROOM:
                pool = DecodeLoad(n, load.concurrency, load.tpot_s, load.step)
                return Sizing(config, "", instance, instance, n, 0, step, pool, None, ttft,
                              cost_per_hour=n * instance.price_per_hour)
        return Sizing(config, f"no co-located pool of up to {MAX_INSTANCES} instances meets both SLOs",
                      instance, instance)


def _md1_wait(arrival_rate: float, service_s: float) -> float:
    """Mean queueing delay of an M/D/1 queue (Pollaczek-Khinchine with deterministic service)."""
    rho = arrival_rate * service_s
    return math.inf if rho >= 1 else rho * service_s / (2 * (1 - rho))


def role_max_tp(catalog: Catalog, role: Role) -> int:
    return catalog.accelerator(role.accelerator).max_tp


def cost_per_million_tokens(cost_per_hour: float, tokens_per_second: float) -> float:
    """USD per million tokens processed (prompt plus output)."""
    return cost_per_hour / (tokens_per_second * 3600) * 1e6
