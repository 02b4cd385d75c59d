"""Seeded discrete-event simulation of a P/D (or co-located) cluster: queues, steps, KV transfer."""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from jido.planner.roofline import StepBatch
from jido.planner.workloads import RequestTrace, Slo


@dataclass(frozen=True)
class PoolSpec:
    """Identical instances of one pool.

    step_time(batch) returns the seconds one engine step takes for that batch; kv_bytes(num_tokens)
    returns the KV bytes a sequence of that length holds. Both must be pure functions.
    """

    num_instances: int
    step_time: Callable[[StepBatch], float]
    kv_bytes: Callable[[float], float]
    kv_capacity_bytes: float
    max_num_seqs: int = 256
    token_budget: int = 8192

    def __post_init__(self) -> None:
        if self.num_instances < 1:
            raise ValueError(f"a pool needs >= 1 instance, got {self.num_instances}")
        if self.token_budget < 1 or self.max_num_seqs < 1:
            raise ValueError("token_budget and max_num_seqs must be >= 1")


@dataclass(frozen=True)
class TransferSpec:
    """KV path from a prefill instance (one link each) to decode: link and codec seconds per prompt."""

    link_s: Callable[[int], float]
    codec_s: Callable[[int], float]
    layerwise: bool
    num_layers: int


@dataclass(frozen=True)
class ClusterSpec:
    """A co-located cluster when prefill is None; otherwise disaggregated P/D joined by transfer."""

    decode: PoolSpec
    prefill: PoolSpec | None = None
    transfer: TransferSpec | None = None
    prefix_share: float = 0.0

    def __post_init__(self) -> None:
        if (self.prefill is None) != (self.transfer is None):
            raise ValueError("a disaggregated cluster needs both a prefill pool and a transfer spec")


@dataclass(frozen=True)
class SimResult:
    """Latency percentiles in ms (inf when a request timed out), SLO attainment and goodput."""

    num_requests: int
    num_completed: int
    num_timed_out: int
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    slo_attainment: float
    goodput_rps: float

    def meets(self, target: float) -> bool:
        return self.slo_attainment >= target


@dataclass(eq=False)
class _Req:
    arrival_s: float
    input_len: int
    output_len: int
    cached_len: int = 0
    num_computed_tokens: int = 0
    num_generated: int = 0
    first_token_s: float = math.inf
    finish_s: float = math.inf


@dataclass(eq=False)
class _Instance:
    """One engine: FCFS prompts in `waiting`, KV-ready requests in `pending`, decoding in `running`."""

    pool: PoolSpec
    prefills: bool
    decodes: bool
    waiting: deque = field(default_factory=deque)
    pending: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    kv_used: float = 0.0
    num_kv_tokens: int = 0
    busy: bool = False
    link_free_s: float = 0.0
    num_queued_tokens: int = 0

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.pending) + len(self.running)

    def admit(self, req: _Req) -> bool:
        """Reserve KV for the whole request; NOTE: freed only when the request finishes."""
        need = self.pool.kv_bytes(req.input_len + req.output_len)
        if len(self.running) >= self.pool.max_num_seqs or self.kv_used + need > self.pool.kv_capacity_bytes:
            return False
        self.kv_used += need
        return True

    def release(self, req: _Req) -> None:
        self.kv_used -= self.pool.kv_bytes(req.input_len + req.output_len)
        self.num_kv_tokens -= req.input_len + req.num_generated

    def form_step(self) -> tuple[list[_Req], list[tuple[_Req, int]], StepBatch]:
        while self.decodes and self.pending and self.admit(self.pending[0]):
            req = self.pending.popleft()
            self.running.append(req)
            self.num_kv_tokens += req.input_len + req.num_generated
        decoding = list(self.running)
        chunks = self._prefill_chunks(self.pool.token_budget - len(decoding)) if self.prefills else []
        new_tokens = sum(n for _, n in chunks)
        pairs = sum(n * (r.num_computed_tokens + n / 2) for r, n in chunks)
        return decoding, chunks, StepBatch(new_tokens, pairs, len(decoding), self.num_kv_tokens)

    def _prefill_chunks(self, budget: int) -> list[tuple[_Req, int]]:
        chunks = []
        for req in self.waiting:
            if budget <= 0:
                break
            if self.decodes and req.num_computed_tokens == req.cached_len and not self.admit(req):
                break  # co-located: a prompt starts only when its KV fits
            n = min(budget, req.input_len - req.num_computed_tokens)
            chunks.append((req, n))
            budget -= n
        return chunks


class _Simulation:
    def __init__(self, cluster: ClusterSpec, trace: RequestTrace, timeout_s: float) -> None:
        self.cluster = cluster
        self.timeout_s = timeout_s
        self.requests = [_Req(float(a), int(i), int(o)) for a, i, o in
                         zip(trace.arrival_s, trace.input_lens, trace.output_lens)]
        for req in self.requests:
            req.cached_len = min(req.input_len - 1, round(req.input_len * cluster.prefix_share))
            req.num_computed_tokens = req.cached_len
        colocated = cluster.prefill is None
        self.decoders = [_Instance(cluster.decode, colocated, True) for _ in range(cluster.decode.num_instances)]
        self.prefillers = self.decoders if colocated else [
            _Instance(cluster.prefill, True, False) for _ in range(cluster.prefill.num_instances)]
        self.events: list = []
        self.counter = itertools.count()

    def push(self, time_s: float, handler: Callable, *args: object) -> None:
        heapq.heappush(self.events, (time_s, next(self.counter), handler, args))

    def run(self) -> list[_Req]:
        for req in self.requests:
            self.push(req.arrival_s, self.on_arrival, req)
        horizon = self.requests[-1].arrival_s + self.timeout_s
        while self.events and self.events[0][0] <= horizon:
            time_s, _, handler, args = heapq.heappop(self.events)
            handler(time_s, *args)
        return self.requests

    def on_arrival(self, now: float, req: _Req) -> None:
        inst = min(self.prefillers, key=lambda i: i.num_queued_tokens)
        inst.waiting.append(req)
        inst.num_queued_tokens += req.input_len - req.num_computed_tokens
        self.kick(inst, now)

    def kick(self, inst: _Instance, now: float) -> None:
        if inst.busy:
            return
        decoding, chunks, batch = inst.form_step()
        if not decoding and not chunks:
            return
        inst.busy = True
        self.push(now + inst.pool.step_time(batch), self.on_step_done, inst, decoding, chunks, now)

    def on_step_done(self, now: float, inst: _Instance, decoding: list[_Req],
                     chunks: list[tuple[_Req, int]], start: float) -> None:
        inst.busy = False
        for req in decoding:
            self.emit_token(inst, req, now)
        for req, n in chunks:
            req.num_computed_tokens += n
            inst.num_queued_tokens -= n
            if req.num_computed_tokens < req.input_len:
                continue
            inst.waiting.remove(req)
            if inst.decodes:  # co-located: the prompt's last chunk yields the first token
                inst.running.append(req)
                inst.num_kv_tokens += req.input_len
                self.emit_token(inst, req, now)
            else:
                self.start_transfer(inst, req, start, now)
        self.kick(inst, now)

    def emit_token(self, inst: _Instance, req: _Req, now: float) -> None:
        req.num_generated += 1
        inst.num_kv_tokens += 1
        req.first_token_s = min(req.first_token_s, now)
        if req.num_generated >= req.output_len:
            req.finish_s = now
            inst.running.remove(req)
            inst.release(req)

    def start_transfer(self, inst: _Instance, req: _Req, prefill_start: float, now: float) -> None:
        spec = self.cluster.transfer
        link_s, codec_s = spec.link_s(req.input_len), spec.codec_s(req.input_len)
        if spec.layerwise:  # layers stream out while later layers compute
            begin = max(prefill_start, inst.link_free_s)
            done = max(begin + link_s, now + link_s / spec.num_layers) + codec_s / spec.num_layers
        else:
            begin = max(now, inst.link_free_s)
            done = begin + link_s + codec_s
        inst.link_free_s = done
        self.push(done, self.on_kv_arrived, req)

    def on_kv_arrived(self, now: float, req: _Req) -> None:
        inst = min(self.decoders, key=lambda i: i.load)
        inst.pending.append(req)
        self.kick(inst, now)


def simulate(cluster: ClusterSpec, trace: RequestTrace, slo: Slo, timeout_s: float = 60.0) -> SimResult:
    """Run the trace through the cluster; requests without a first token by timeout_s count as timed out."""
    requests = _Simulation(cluster, trace, timeout_s).run()
    ttft = np.array([r.first_token_s - r.arrival_s for r in requests])
    tpot = np.array([_tpot(r) for r in requests])
    ok = (ttft * 1e3 <= slo.ttft_ms) & (tpot * 1e3 <= slo.tpot_ms)
    span = max(requests[-1].arrival_s - requests[0].arrival_s, 1e-9)
    return SimResult(
        num_requests=len(requests),
        num_completed=int(sum(math.isfinite(r.finish_s) for r in requests)),
        num_timed_out=int(np.sum(ttft > timeout_s)),
        ttft_ms=_percentiles(ttft * 1e3),
        tpot_ms=_percentiles(tpot * 1e3),
        slo_attainment=float(ok.mean()),
        goodput_rps=float(ok.sum() / span),
    )


def _tpot(req: _Req) -> float:
    if not math.isfinite(req.finish_s):
        return math.inf
    if req.output_len <= 1:
        return 0.0
    return (req.finish_s - req.first_token_s) / (req.output_len - 1)


def _percentiles(values: np.ndarray) -> dict[str, float]:
    # inverted_cdf picks real samples, so a timed-out request shows as inf rather than nan
    return {f"p{q}": float(np.percentile(values, q, method="inverted_cdf")) for q in (50, 90, 99)}
