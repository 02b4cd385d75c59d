"""Prometheus metrics with vLLM's names (plus ``jido:`` extras), kept by prometheus_client in multiprocess mode."""
from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.exposition import generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from jido.core.request import RequestStatus
from jido.engine.async_engine import StepReport
from jido.engine.outputs import RequestOutput
from jido.metrics.stats import KVTierStats, KVTransferStats, SpecDecodingStats

logger = logging.getLogger("jido")

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0)
_STEP_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_PHASES = ("schedule", "prepare", "model", "sample", "propose", "update")
_FINISH_REASONS = tuple(status.value for status in RequestStatus if status.is_finished)  # stop, length, abort
REJECT_REASONS = ("overload", "stopped")
# KVTierStats fields exported per offload tier as counters (jido:kv_offload_<field>{tier=...}).
_TIER_COUNTERS = {
    "hits": "Blocks of a prompt's prefix found in this tier.",
    "misses": "Blocks of a prompt's prefix looked up in this tier and not found.",
    "stored_blocks": "Blocks written to this tier.", "stored_bytes": "Bytes written to this tier.",
    "loaded_blocks": "Blocks loaded from this tier into the device pool.",
    "loaded_bytes": "Bytes loaded from this tier (decoded).",
    "load_seconds": "Seconds spent reading and decoding loaded blocks (over loaded_blocks: mean load latency).",
    "errors": "Failed lookups, writes and reads, and corrupt entries dropped; each one is recomputed.",
}
# KVTransferStats fields exported as counters: (metric, label value, help).
_TRANSFER_COUNTERS = {
    "sent_bytes": ("jido:kv_transfer_bytes", "sent", "KV bytes moved between instances, by direction."),
    "received_bytes": ("jido:kv_transfer_bytes", "received", ""),
    "sent_seconds": ("jido:kv_transfer_seconds", "sent", "Seconds spent moving KV, by direction (bytes over "
                     "seconds: the bandwidth)."),
    "received_seconds": ("jido:kv_transfer_seconds", "received", ""),
    "received_tokens": ("jido:kv_transfer_tokens", "received", "Prompt tokens whose KV was loaded from a producer."),
    "sent": ("jido:kv_transfers", "sent", "KV hand-offs by outcome: sent, received, failed (the consumer "
             "prefilled itself), expired (a producer's lease ran out), push_refused (no room: pulled instead)."),
    "received": ("jido:kv_transfers", "received", ""), "failed": ("jido:kv_transfers", "failed", ""),
    "expired": ("jido:kv_transfers", "expired", ""), "push_refused": ("jido:kv_transfers", "push_refused", ""),
}
_live_dirs: set[str] = set()  # the directories that servers in this process made and still use


@dataclass
class RequestTimer:
    """One request's timeline as the server saw it, for latency metrics."""

    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None
    num_tokens: int = 0  # of the longest completion
    num_generated: int = 0  # over all completions


class MultiprocDir:
    """The server's PROMETHEUS_MULTIPROC_DIR: the user's, or a temporary one made here and removed by close().

    Every process that records metrics (the server now, engine workers later) writes its own files there and
    /metrics merges them. The variable is set for this process and the children it starts.
    """

    def __init__(self) -> None:
        user_dir = os.environ.get(MULTIPROC_DIR_ENV)
        self._temporary: tempfile.TemporaryDirectory[str] | None = None
        self._previous = user_dir
        if user_dir and user_dir not in _live_dirs:
            logger.warning("%s=%s was set by the user: wipe it between runs or counters go on from the last one; "
                           "unset it and jido makes and removes a fresh one per server", MULTIPROC_DIR_ENV, user_dir)
            os.makedirs(user_dir, exist_ok=True)
            self.path = user_dir
            return
        self._temporary = tempfile.TemporaryDirectory(prefix="jido-prometheus-")
        self.path = self._temporary.name
        _live_dirs.add(self.path)
        os.environ[MULTIPROC_DIR_ENV] = self.path

    def close(self) -> None:
        """Drop this process's live gauges; a temporary directory goes, with the variable pointing at it."""
        mark_process_dead(os.getpid(), self.path)
        if self._temporary is None:
            return
        _live_dirs.discard(self.path)
        if os.environ.get(MULTIPROC_DIR_ENV) == self.path:
            if self._previous in _live_dirs:  # another server of this process still writes there
                os.environ[MULTIPROC_DIR_ENV] = self._previous
            else:
                del os.environ[MULTIPROC_DIR_ENV]
        self._temporary.cleanup()


@contextmanager
def _values_in_files() -> Iterator[type]:
    """Metrics built inside keep their values in files under $PROMETHEUS_MULTIPROC_DIR.

    prometheus_client picks its value class once, when first imported, from that variable, which a server
    sets later; each server gets a value class of its own, whose files it can close. NOTE: every labelled
    child is made inside, in ServerMetrics.__init__: one made later would take whatever class is current.
    """
    previous = values.ValueClass
    values.ValueClass = values.MultiProcessValue()
    try:
        yield values.ValueClass
    finally:
        values.ValueClass = previous


class ServerMetrics:
    """Every metric the server exports, labelled with the served model name as vLLM does.

    All series exist from the start, at zero, so dashboards and alerts see a value before the first request.
    """

    def __init__(self, model_name: str, max_model_len: int, offload_tiers: tuple[str, ...] = (),
                 kv_block_bytes: int = 0, num_expert_ranks: int = 0, kv_transfer: bool = False,
                 num_speculative_tokens: int = 0, kernel_fallbacks: dict[str, str] | None = None) -> None:
        self.dir = MultiprocDir()
        self._registry = CollectorRegistry()
        MultiProcessCollector(self._registry, path=self.dir.path)
        self._engine_totals: dict[str, int] = {}
        self._spec_totals = SpecDecodingStats()
        self.num_speculative_tokens = num_speculative_tokens
        self._kv_usage_value = self._kv_peak_value = 0.0  # this process's, for the peak between scrapes
        self._closed = False
        self._kv_block_bytes = kv_block_bytes
        self._pin_hits: dict[str, int] = {}
        with _values_in_files() as value_class:
            self._value_class = value_class
            self._make_metrics(model_name, _one_two_five(max_model_len), num_expert_ranks)
            self._make_tier_metrics(model_name, offload_tiers)
            self._make_transfer_metrics(model_name, kv_transfer)
            self._make_kernel_metrics(model_name, kernel_fallbacks or {})

    def _make_metrics(self, model_name: str, token_buckets: tuple[float, ...], num_expert_ranks: int) -> None:
        labels = {"model_name": model_name}

        def gauge(name: str, help_text: str) -> Gauge:
            # The most recent value of the processes alive: a dead worker's last reading is no reading.
            # NOTE: a value never set has no time, so it is not exported; hence the explicit zero.
            child = Gauge(name, help_text, ["model_name"], registry=None,
                          multiprocess_mode="livemostrecent").labels(**labels)
            child.set(0)
            return child

        def counter(name: str, help_text: str) -> Counter:
            return Counter(name, help_text, ["model_name"], registry=None).labels(**labels)

        def counters(name: str, help_text: str, label: str, label_values: tuple[str, ...]) -> dict[str, Counter]:
            family = Counter(name, help_text, ["model_name", label], registry=None)
            return {value: family.labels(**labels, **{label: value}) for value in label_values}

        def histogram(name: str, help_text: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, help_text, ["model_name"], registry=None, buckets=buckets).labels(**labels)

        self.running = gauge("vllm:num_requests_running", "Sequences running in the engine.")
        self.waiting = gauge("vllm:num_requests_waiting", "Sequences accepted but not yet running.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).")
        self.kv_peak = gauge("jido:kv_cache_usage_perc_max",
                             "Highest fraction of KV blocks in use since the previous scrape, within steps too.")
        self.engine_counters = {
            "prefix_cache_queries": counter("vllm:prefix_cache_queries",
                                            "Prompt tokens looked up in the prefix cache."),
            "prefix_cache_hits": counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache."),
            "num_preemptions": counter("vllm:num_preemptions", "Sequences preempted for lack of KV blocks."),
        }
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens, counted as they stream.")
        self.success = counters("vllm:request_success", "Finished requests, by finish reason.", "finished_reason",
                                _FINISH_REASONS)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first token.", _TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between output tokens.", _ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Per request: (last token - first token) / (output tokens - 1).",
                              _ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.", _REQUEST_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds", "Arrival to first scheduled, less any wait "
                                    "for KV from another instance.", _REQUEST_BUCKETS)
        # TTFT = queue + prefill (or, for KV from a producer: queue + transfer + first decode)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds", "First scheduled to first token, for "
                                      "requests that computed their prompt here.", _TTFT_BUCKETS)

        self.prompt_len = histogram("vllm:request_prompt_tokens", "Prompt tokens per finished request.", token_buckets)
        self.output_len = histogram("vllm:request_generation_tokens", "Output tokens per finished request.",
                                    token_buckets)
        step_time = Histogram("jido:step_time_seconds", "Engine step time by phase.", ["model_name", "phase"],
                              registry=None, buckets=_STEP_BUCKETS)
        self.step_time = {phase: step_time.labels(**labels, phase=phase) for phase in _PHASES}
        self.step_tokens = histogram("jido:step_tokens", "Tokens computed per engine step.", token_buckets)
        self.step_reqs = histogram("jido:step_num_requests",
                                   "Requests computed per engine step that computed any (the batch size).",
                                   token_buckets)
        self.rejected = counters("jido:requests_rejected", "Requests refused before reaching the engine, by reason.",
                                 "reason", REJECT_REASONS)
        self.aborted = counter("jido:requests_aborted", "Requests abandoned before finishing (client gone).")
        self.expert_load = counters("jido:expert_load", "(token, expert) pairs routed to the experts each "
                                    "expert-parallel rank holds (mixture-of-experts models only).", "ep_rank",
                                    tuple(str(rank) for rank in range(num_expert_ranks)))
        self.pinned_prefixes = gauge("jido:kv_pinned_prefixes", "Prefixes pinned with POST /v1/cache.")
        self.pinned_bytes = gauge("jido:kv_pinned_bytes", "KV bytes the pinned prefixes hold in the device pool.")
        self.pinned_tokens = gauge("jido:kv_pinned_tokens", "Tokens whose KV the pinned prefixes hold.")
        self.pinned_hits = counter("jido:kv_pinned_hits", "Requests admitted whose cached prefix covered a pinned one.")
        if self.num_speculative_tokens:
            self._make_spec_metrics(counter, counters)

    def _make_spec_metrics(self, counter: Callable[[str, str], Counter],
                           counters: Callable[[str, str, str, tuple[str, ...]], dict[str, Counter]]) -> None:
        """vLLM's speculative decoding counters, exported when the engine speculates."""
        self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Requests' proposals verified (one per request "
                                   "and step).")
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Proposed tokens verified.")
        self.spec_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Proposed tokens accepted.")
        positions = tuple(str(i) for i in range(self.num_speculative_tokens))
        self.spec_accepted_per_pos = counters("vllm:spec_decode_num_accepted_tokens_per_pos",
                                              "Accepted proposals by position in their draft (0: the first).",
                                              "position", positions)

    def _make_tier_metrics(self, model_name: str, tiers: tuple[str, ...]) -> None:
        labels = ["model_name", "tier"]
        self.tier_counters = {
            key: {t: Counter(f"jido:kv_offload_{key}", text, labels, registry=None).labels(model_name, t) for t in tiers}
            for key, text in _TIER_COUNTERS.items()}
        used = Gauge("jido:kv_offload_used_bytes", "Bytes held in this (local) tier now.", labels, registry=None,
                     multiprocess_mode="livemostrecent")
        enabled = Gauge("jido:kv_offload_tier_enabled", "1 while the tier takes writes (a full disk turns it off).",
                        labels, registry=None, multiprocess_mode="livemostrecent")
        self.tier_used = {t: used.labels(model_name, t) for t in tiers}
        self.tier_enabled = {t: enabled.labels(model_name, t) for t in tiers}
        for t in tiers:
            self.tier_used[t].set(0)
            self.tier_enabled[t].set(1)
        self._tier_totals: dict[tuple[str, str], float] = {}

    def _make_kernel_metrics(self, model_name: str, fallbacks: dict[str, str]) -> None:
        """Which C++ kernel libraries the workers failed to build: a count, always exported (0 where every one built),
        and a series per library naming what runs instead; set once, as builds happen before serving."""
        count = Gauge("jido:kernel_fallbacks", "C++ kernel libraries that failed to build, whose slower PyTorch "
                      "fallbacks run instead (`jido build-kernels` rebuilds them and keeps the compiler's output).",
                      ["model_name"], registry=None, multiprocess_mode="livemostrecent")
        count.labels(model_name).set(len(fallbacks))
        if not fallbacks:
            return
        info = Gauge("jido:kernel_fallback_info", "1 for each C++ kernel library on its fallback, with what runs.",
                     ["model_name", "library", "fallback"], registry=None, multiprocess_mode="livemostrecent")
        for library, fallback in sorted(fallbacks.items()):
            info.labels(model_name, library, fallback).set(1)

    def _make_transfer_metrics(self, model_name: str, enabled: bool) -> None:
        self.transfer_counters: dict[str, Counter] = {}
        self._transfer_totals: dict[str, float] = {}
        if not enabled:
            self.transfer_held = self.transfer_time = self.first_decode_time = None
            return

        def histogram(name: str, help_text: str) -> Histogram:
            return Histogram(name, help_text, ["model_name"], registry=None, buckets=_TTFT_BUCKETS).labels(model_name)

        self.transfer_time = histogram("jido:kv_transfer_time_seconds", "Time a request waited for its KV from a "
                                       "producer (WAITING_FOR_REMOTE_KVS).")
        self.first_decode_time = histogram("jido:request_first_decode_time_seconds", "First scheduled to first "
                                           "token, for requests whose prompt KV came from a producer.")
        families: dict[str, Counter] = {}
        for key, (name, direction, text) in _TRANSFER_COUNTERS.items():
            label = "result" if name == "jido:kv_transfers" else "direction"
            if name not in families:
                families[name] = Counter(name, text, ["model_name", label], registry=None)
            self.transfer_counters[key] = families[name].labels(model_name, direction)
        self.transfer_held = Gauge("jido:kv_transfer_held", "KV hand-offs a producer holds for consumers now.",
                                   ["model_name"], registry=None, multiprocess_mode="livemostrecent").labels(model_name)
        self.transfer_held.set(0)

    def _record_transfers(self, records: tuple) -> None:
        for record in records:
            if not isinstance(record, KVTransferStats) or self.transfer_held is None:
                continue
            for key, child in self.transfer_counters.items():
                total, seen = getattr(record, key), self._transfer_totals.get(key, 0)
                if total > seen:
                    child.inc(total - seen)
                    self._transfer_totals[key] = total
            self.transfer_held.set(record.held)

    def _record_tiers(self, tiers: tuple) -> None:
        for tier in tiers:
            if not isinstance(tier, KVTierStats) or tier.tier not in self.tier_used:
                continue
            for key, children in self.tier_counters.items():
                total, seen = getattr(tier, key), self._tier_totals.get((tier.tier, key), 0)
                if total > seen:
                    children[tier.tier].inc(total - seen)
                    self._tier_totals[(tier.tier, key)] = total
            self.tier_used[tier.tier].set(tier.used_bytes)
            self.tier_enabled[tier.tier].set(1 if tier.enabled else 0)

    def render(self) -> bytes:
        """The Prometheus text exposition (format 0.0.4), merged over the processes' files; resets the KV peak.

        Never OpenMetrics: prometheus_client escapes the colons of its sample names to underscores there
        (vllm_..., under HELP lines that keep vllm:...), which would rename every metric.
        """
        text = generate_latest(self._registry)
        # A peak since the last scrape: start the next window from the usage now.
        self._kv_peak_value = self._kv_usage_value
        self.kv_peak.set(self._kv_peak_value)
        return text

    def _record_pins(self, pins: tuple) -> None:
        # Totals only: a series per pin id would grow with every pin ever made (GET /v1/cache lists each pin).
        self.pinned_prefixes.set(len(pins))
        self.pinned_tokens.set(sum(p.num_tokens for p in pins))
        self.pinned_bytes.set(sum(p.num_blocks for p in pins) * self._kv_block_bytes)
        for pin in pins:
            if pin.hits > self._pin_hits.get(pin.pin_id, 0):
                self.pinned_hits.inc(pin.hits - self._pin_hits.get(pin.pin_id, 0))
        self._pin_hits = {p.pin_id: p.hits for p in pins}

    def close(self) -> None:
        """At shutdown: close and remove the files. Requests still finishing after this record nothing."""
        if self._closed:
            return
        self._closed = True
        self._value_class.close_all_files()
        self.dir.close()

    # -- recording --------------------------------------------------------------------------------
    def on_report(self, report: StepReport, num_waiting: int) -> None:
        """Engine state after a loop iteration (called on the event loop)."""
        if self._closed:
            return
        stats = report.stats
        self.running.set(stats.num_running)
        self.waiting.set(num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        step_peak = max(stats.kv_cache_usage, report.times.kv_cache_usage_peak if report.times else 0.0)
        self._kv_usage_value = stats.kv_cache_usage
        self._kv_peak_value = max(self._kv_peak_value, step_peak)
        self.kv_peak.set(self._kv_peak_value)
        for key, child in self.engine_counters.items():
            # The scheduler reports running totals; the counter advances by the difference.
            total = getattr(stats, key)
            if total > self._engine_totals.get(key, 0):
                child.inc(total - self._engine_totals.get(key, 0))
                self._engine_totals[key] = total
        self._record_tiers(stats.kv_connector)
        self._record_transfers(stats.kv_connector)
        self._record_pins(stats.pinned)
        if self.num_speculative_tokens:
            self._advance_spec(stats.spec_decoding)
        for seconds in report.queue_times_s:
            self.queue_time.observe(seconds)
        if report.times is not None:
            times = report.times
            for phase, seconds in zip(_PHASES, (times.schedule_s, times.prepare_s, times.model_s, times.sample_s,
                                                times.propose_s, times.update_s)):
                self.step_time[phase].observe(seconds)
            self.step_tokens.observe(times.num_tokens)
            if times.num_reqs:
                self.step_reqs.observe(times.num_reqs)
            for rank, num_pairs in enumerate(times.expert_load):
                self.expert_load[str(rank)].inc(num_pairs)

    def _advance_spec(self, totals: SpecDecodingStats) -> None:
        """The scheduler's speculative decoding totals, as counter increments since the last report."""
        last = self._spec_totals
        if totals.num_drafts <= last.num_drafts:
            return
        self.spec_drafts.inc(totals.num_drafts - last.num_drafts)
        self.spec_draft_tokens.inc(totals.num_draft_tokens - last.num_draft_tokens)
        self.spec_accepted_tokens.inc(totals.num_accepted_tokens - last.num_accepted_tokens)
        before = last.num_accepted_tokens_per_pos
        for pos, total in enumerate(totals.num_accepted_tokens_per_pos[:self.num_speculative_tokens]):
            self.spec_accepted_per_pos[str(pos)].inc(total - (before[pos] if pos < len(before) else 0))
        self._spec_totals = totals

    def on_output(self, timer: RequestTimer, output: RequestOutput) -> None:
        """A request's new cumulative output: token timings, and totals once it finished."""
        if self._closed:
            return
        now = time.monotonic()
        num_tokens = max(len(c.token_ids) for c in output.outputs)
        num_new = num_tokens - timer.num_tokens
        if num_new > 0:
            self._observe_tokens(timer, now, num_new, output)
            timer.num_tokens = num_tokens
        num_generated = sum(len(c.token_ids) for c in output.outputs)
        self.generation_tokens.inc(num_generated - timer.num_generated)
        timer.num_generated = num_generated
        if output.finished:
            self._observe_finished(timer, now, output)

    def on_rejected(self, reason: str) -> None:
        """A request refused before the engine; ``reason`` is one of REJECT_REASONS."""
        if not self._closed:
            self.rejected[reason].inc()

    def on_aborted(self, num_seqs: int) -> None:
        """A request of ``num_seqs`` sequences abandoned before finishing: each finishes as an ``abort``."""
        if not self._closed:
            self.aborted.inc()
            self.success["abort"].inc(num_seqs)

    def _observe_tokens(self, timer: RequestTimer, now: float, num_new: int, output: RequestOutput) -> None:
        if timer.first_token is None:
            timer.first_token = now
            self.ttft.observe(now - timer.arrival)
            self._observe_phases(output)
            num_new -= 1
        if num_new > 0 and timer.last_token is not None:
            # Tokens that arrive together share the wait evenly.
            for _ in range(num_new):
                self.itl.observe((now - timer.last_token) / num_new)
        timer.last_token = now

    def _observe_phases(self, output: RequestOutput) -> None:
        """TTFT's parts after the queue: prefill here, or the transfer from a producer and the first decode."""
        scheduled, first = output.metrics.get("first_scheduled_time"), output.metrics.get("first_token_time")
        if not scheduled or not first:
            return
        transfer = output.metrics.get("kv_transfer_time", 0.0)
        if transfer > 0 and self.transfer_time is not None:
            self.transfer_time.observe(transfer)
            self.first_decode_time.observe(first - scheduled)
        else:
            self.prefill_time.observe(first - scheduled)

    def _observe_finished(self, timer: RequestTimer, now: float, output: RequestOutput) -> None:
        num_generated = sum(len(c.token_ids) for c in output.outputs)
        self.e2e.observe(now - timer.arrival)
        self.prompt_tokens.inc(len(output.prompt_token_ids))
        self.prompt_len.observe(len(output.prompt_token_ids))
        self.output_len.observe(num_generated)
        if timer.num_tokens > 1 and timer.first_token is not None:
            self.tpot.observe((now - timer.first_token) / (timer.num_tokens - 1))
        for completion in output.outputs:
            self.success[completion.finish_reason or "abort"].inc()


def _one_two_five(limit: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit``, as vLLM buckets token counts."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > limit:
                return tuple(buckets)
            buckets.append(float(mantissa * scale))
        scale *= 10
