"""What the server says about the run through vLLM-style /metrics: queue time, KV usage, prefix hits, speculation."""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from jido.planner.prometheus import Metrics, MetricsError, parse_metrics

QUEUE_TIME = "vllm:request_queue_time_seconds"
PREFIX_HITS, PREFIX_QUERIES = "vllm:prefix_cache_hits", "vllm:prefix_cache_queries"
PREEMPTIONS = "vllm:num_preemptions"
# vLLM v1 names the gauge kv_cache_usage_perc; older releases used gpu_cache_usage_perc. Both are 0..1.
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
# jido's peak since the previous scrape, steps included: a 1 s sample of the gauge above misses a request
# that is allocated and freed within one step (a long prompt with one output token).
KV_USAGE_PEAK = "jido:kv_cache_usage_perc_max"
WAITING, RUNNING = "vllm:num_requests_waiting", "vllm:num_requests_running"
BATCH_SIZE = "jido:step_num_requests"  # requests per engine step that computed any
# jido's KV offload tiers, one series per tier label (docs/kv_cache.md).
OFFLOAD = "jido:kv_offload_"
OFFLOAD_COUNTERS = ("hits", "misses", "stored_bytes", "loaded_blocks", "loaded_bytes", "load_seconds", "errors")
SPEC_DRAFTS, SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED, SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos"


async def scrape(session: aiohttp.ClientSession, url: str) -> Metrics | None:
    """The parsed /metrics, or None when the server has none (or not in Prometheus text)."""
    try:
        async with session.get(url) as response:
            if response.status != 200:
                return None
            return parse_metrics(await response.text())
    except (aiohttp.ClientError, TimeoutError, MetricsError, UnicodeDecodeError):
        return None


@dataclass
class GaugeSampler:
    """Polls /metrics while the run goes, keeping the gauges that a before/after diff cannot show."""

    session: aiohttp.ClientSession
    url: str
    interval_s: float = 1.0
    samples: list[Metrics] = field(default_factory=list)
    _stopped: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        """Scrape every interval_s until stop(); a scrape under way then is finished and kept."""
        # NOTE: not cancelled mid-scrape: the server may have answered (and reset its KV peak), and a lost
        # answer would lose the peak with it.
        while not self._stopped.is_set():
            metrics = await scrape(self.session, self.url)
            if metrics is not None:
                self.samples.append(metrics)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), self.interval_s)

    def stop(self) -> None:
        self._stopped.set()


def run_metrics(before: Metrics | None, after: Metrics | None, samples: list[Metrics]) -> dict[str, Any]:
    """jido's server-side keys over the run: counters as after - before, gauges as mean and max of samples."""
    if before is None or after is None:
        return {"server_metrics_available": False}
    result: dict[str, Any] = {"server_metrics_available": True}
    queue_s = _delta(before, after, f"{QUEUE_TIME}_sum")
    queue_n = _delta(before, after, f"{QUEUE_TIME}_count")
    result["server_mean_queue_time_ms"] = queue_s / queue_n * 1000 if queue_s is not None and queue_n else None
    hits, queries = _delta(before, after, PREFIX_HITS), _delta(before, after, PREFIX_QUERIES)
    result["server_prefix_cache_hit_rate"] = hits / queries if hits is not None and queries else None
    result["server_num_preemptions"] = _delta(before, after, PREEMPTIONS)
    reqs, steps = _delta(before, after, f"{BATCH_SIZE}_sum"), _delta(before, after, f"{BATCH_SIZE}_count")
    result["server_mean_batch_size"] = reqs / steps if reqs is not None and steps else None
    result.update(spec_decode_metrics(before, after))
    for key, names in (("kv_cache_usage", KV_USAGE), ("num_requests_waiting", (WAITING,)),
                       ("num_requests_running", (RUNNING,))):
        values = [v for v in (_gauge(m, names) for m in [*samples, after]) if v is not None]
        result[f"server_mean_{key}"] = sum(values) / len(values) if values else None
        result[f"server_max_{key}"] = max(values) if values else None
    peaks = [v for v in (m.total(KV_USAGE_PEAK) for m in [*samples, after]) if v is not None]
    if peaks:  # the scrape before the run reset the peak, so these cover the run alone
        result["server_max_kv_cache_usage"] = max(peaks)
    result["server_max_kv_cache_usage_source"] = KV_USAGE_PEAK if peaks else "sampled every second"
    tiers = offload_deltas(before, after)
    if tiers:
        result["server_kv_offload"] = tiers
    return result


def offload_deltas(before: Metrics, after: Metrics) -> dict[str, dict[str, float | None]]:
    """Per KV offload tier over the run: its counters' deltas, hit rate and mean load latency (ms)."""
    tiers: dict[str, dict[str, float | None]] = {}
    for key in OFFLOAD_COUNTERS:
        for tier, value in _by_label(after, f"{OFFLOAD}{key}", "tier").items():
            tiers.setdefault(tier, {})[key] = value - _by_label(before, f"{OFFLOAD}{key}", "tier").get(tier, 0.0)
    for counters in tiers.values():
        looked_up = counters.get("hits", 0) + counters.get("misses", 0)
        counters["hit_rate"] = counters.get("hits", 0) / looked_up if looked_up else None
        loaded = counters.get("loaded_blocks", 0)
        counters["mean_load_ms"] = counters.get("load_seconds", 0) / loaded * 1000 if loaded else None
    return tiers


def spec_decode_metrics(before: Metrics, after: Metrics) -> dict[str, Any]:
    """Speculative decoding over the run, from vLLM's counters; nothing when the server does not speculate.

    Mean acceptance length is vLLM's: tokens a request gains per verifying step, 1 + accepted / drafts.
    """
    drafts = _delta(before, after, SPEC_DRAFTS)
    if drafts is None:
        return {}
    draft_tokens, accepted = _delta(before, after, SPEC_DRAFT_TOKENS), _delta(before, after, SPEC_ACCEPTED)
    per_pos = _by_label(after, SPEC_ACCEPTED_PER_POS, "position")
    start = _by_label(before, SPEC_ACCEPTED_PER_POS, "position")
    positions = sorted(per_pos, key=int)
    return {
        "server_spec_decode_num_drafts": drafts,
        "server_spec_decode_num_draft_tokens": draft_tokens,
        "server_spec_decode_num_accepted_tokens": accepted,
        "server_spec_decode_acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "server_spec_decode_mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "server_spec_decode_acceptance_rate_per_pos": [
            (per_pos[p] - start.get(p, 0.0)) / drafts if drafts else None for p in positions],
    }


def _by_label(metrics: Metrics, name: str, label: str) -> dict[str, float]:
    """A counter family's values by one label (summed over the others)."""
    values: dict[str, float] = {}
    for candidate in (name, f"{name}_total"):
        for labels, value in metrics.samples.get(candidate, []):
            values[labels.get(label, "")] = values.get(labels.get(label, ""), 0.0) + value
    return values


def _delta(before: Metrics, after: Metrics, name: str) -> float | None:
    start, end = before.total(name), after.total(name)
    if end is None:
        return None
    return end - (start or 0.0)


def _gauge(metrics: Metrics, names: tuple[str, ...]) -> float | None:
    for name in names:
        value = metrics.total(name)
        if value is not None:
            return value
    return None
