"""Prometheus metrics with vLLM's names (plus ``jido:`` extras), recorded from requests and engine steps."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from jido.core.request import RequestStatus
from jido.engine.async_engine import StepReport
from jido.engine.outputs import RequestOutput

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0)
_STEP_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_PHASES = ("schedule", "model", "sample", "update")
_FINISH_REASONS = tuple(status.value for status in RequestStatus if status.is_finished)  # stop, length, abort
_ZERO_AT_START = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                  "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions",
                  "vllm:prompt_tokens", "vllm:generation_tokens", "jido:requests_aborted",
                  "jido:kv_cache_usage_perc_max")

Labels = tuple[tuple[str, str], ...]


@dataclass
class _Family:
    """One metric name: a counter or gauge (one value per label set) or a histogram (buckets per set)."""

    name: str
    kind: str  # "counter" | "gauge" | "histogram"
    help: str
    buckets: tuple[float, ...] = ()
    values: dict[Labels, float] = field(default_factory=dict)
    histograms: dict[Labels, list[float]] = field(default_factory=dict)  # bucket counts, then sum, count

    def set(self, value: float, labels: Labels) -> None:
        self.values[labels] = value

    def inc(self, amount: float, labels: Labels) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def observe(self, value: float, labels: Labels) -> None:
        counts = self.histograms.setdefault(labels, [0.0] * (len(self.buckets) + 2))
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                counts[i] += 1
        counts[-2] += value
        counts[-1] += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        suffix = "_total" if self.kind == "counter" else ""
        for labels, value in self.values.items():
            lines.append(f"{self.name}{suffix}{_labels(labels)} {_number(value)}")
        for labels, counts in self.histograms.items():
            for bound, count in zip((*self.buckets, math.inf), (*counts[:-2], counts[-1])):
                lines.append(f"{self.name}_bucket{_labels(labels + (('le', _number(bound)),))} {_number(count)}")
            lines.append(f"{self.name}_sum{_labels(labels)} {_number(counts[-2])}")
            lines.append(f"{self.name}_count{_labels(labels)} {_number(counts[-1])}")
        return lines


@dataclass
class RequestTimer:
    """One request's timeline as the server saw it, for latency metrics."""

    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None
    num_tokens: int = 0  # of the longest completion
    num_generated: int = 0  # over all completions


class ServerMetrics:
    """Every metric the server exports, labelled with the served model name as vLLM does."""

    def __init__(self, model_name: str, max_model_len: int) -> None:
        self._labels: Labels = (("model_name", model_name),)
        self._families: dict[str, _Family] = {}
        token_buckets = _one_two_five(max_model_len)
        for name, kind, help_text, buckets in (
            ("vllm:num_requests_running", "gauge", "Sequences running in the engine.", ()),
            ("vllm:num_requests_waiting", "gauge", "Sequences accepted but not yet running.", ()),
            ("vllm:kv_cache_usage_perc", "gauge", "Fraction of KV blocks in use (1 = full).", ()),
            ("jido:kv_cache_usage_perc_max", "gauge",
             "Highest fraction of KV blocks in use since the previous scrape, within steps too.", ()),
            ("vllm:prefix_cache_queries", "counter", "Prompt tokens looked up in the prefix cache.", ()),
            ("vllm:prefix_cache_hits", "counter", "Prompt tokens found in the prefix cache.", ()),
            ("vllm:num_preemptions", "counter", "Sequences preempted for lack of KV blocks.", ()),
            ("vllm:prompt_tokens", "counter", "Prompt tokens of finished requests.", ()),
            ("vllm:generation_tokens", "counter", "Generated tokens, counted as they stream.", ()),
            ("vllm:request_success", "counter", "Finished requests, by finish reason.", ()),
            ("vllm:time_to_first_token_seconds", "histogram", "Arrival to first token.", _TTFT_BUCKETS),
            ("vllm:inter_token_latency_seconds", "histogram", "Time between output tokens.", _ITL_BUCKETS),
            ("vllm:request_time_per_output_token_seconds", "histogram",
             "Per request: (last token - first token) / (output tokens - 1).", _ITL_BUCKETS),
            ("vllm:e2e_request_latency_seconds", "histogram", "Arrival to last token.", _REQUEST_BUCKETS),
            ("vllm:request_queue_time_seconds", "histogram", "Arrival to first scheduled.", _REQUEST_BUCKETS),
            ("vllm:request_prompt_tokens", "histogram", "Prompt tokens per finished request.", token_buckets),
            ("vllm:request_generation_tokens", "histogram", "Output tokens per finished request.", token_buckets),
            ("jido:step_time_seconds", "histogram", "Engine step time by phase.", _STEP_BUCKETS),
            ("jido:step_tokens", "histogram", "Tokens computed per engine step.", token_buckets),
            ("jido:requests_rejected", "counter", "Requests refused before reaching the engine, by reason.", ()),
            ("jido:requests_aborted", "counter", "Requests abandoned before finishing (client gone).", ()),
        ):
            self._families[name] = _Family(name, kind, help_text, buckets)
        # Exported at zero before the first request, as vLLM does, so dashboards and alerts see a value.
        for name in _ZERO_AT_START:
            self._families[name].set(0.0, self._labels)
        for reason in _FINISH_REASONS:
            self._families["vllm:request_success"].set(0.0, self._labels + (("finished_reason", reason),))

    def __getitem__(self, name: str) -> _Family:
        return self._families[name]

    def render(self) -> str:
        """The exposition text. NOTE: resets the KV peak to the current usage (a peak since the last scrape)."""
        text = "\n".join(line for family in self._families.values() for line in family.render()) + "\n"
        peak, usage = self["jido:kv_cache_usage_perc_max"], self["vllm:kv_cache_usage_perc"]
        peak.set(usage.values[self._labels], self._labels)
        return text

    # -- recording --------------------------------------------------------------------------------
    def on_report(self, report: StepReport, num_waiting: int) -> None:
        """Engine state after a loop iteration (called on the event loop)."""
        stats, labels = report.stats, self._labels
        self["vllm:num_requests_running"].set(stats.num_running, labels)
        self["vllm:num_requests_waiting"].set(num_waiting, labels)
        self["vllm:kv_cache_usage_perc"].set(stats.kv_cache_usage, labels)
        step_peak = max(stats.kv_cache_usage, report.times.kv_cache_usage_peak if report.times else 0.0)
        peak = self["jido:kv_cache_usage_perc_max"]
        peak.set(max(peak.values[labels], step_peak), labels)
        self["vllm:prefix_cache_queries"].set(stats.prefix_cache_queries, labels)
        self["vllm:prefix_cache_hits"].set(stats.prefix_cache_hits, labels)
        self["vllm:num_preemptions"].set(stats.num_preemptions, labels)
        for seconds in report.queue_times_s:
            self["vllm:request_queue_time_seconds"].observe(seconds, labels)
        if report.times is not None:
            times = report.times
            for phase, seconds in zip(_PHASES, (times.schedule_s, times.model_s, times.sample_s, times.update_s)):
                self["jido:step_time_seconds"].observe(seconds, labels + (("phase", phase),))
            self["jido:step_tokens"].observe(times.num_tokens, labels)

    def on_output(self, timer: RequestTimer, output: RequestOutput) -> None:
        """A request's new cumulative output: token timings, and totals once it finished."""
        now = time.monotonic()
        num_tokens = max(len(c.token_ids) for c in output.outputs)
        num_new = num_tokens - timer.num_tokens
        if num_new > 0:
            self._observe_tokens(timer, now, num_new)
            timer.num_tokens = num_tokens
        num_generated = sum(len(c.token_ids) for c in output.outputs)
        self["vllm:generation_tokens"].inc(num_generated - timer.num_generated, self._labels)
        timer.num_generated = num_generated
        if output.finished:
            self._observe_finished(timer, now, output)

    def on_rejected(self, reason: str) -> None:
        self["jido:requests_rejected"].inc(1, self._labels + (("reason", reason),))

    def on_aborted(self) -> None:
        self["jido:requests_aborted"].inc(1, self._labels)

    def _observe_tokens(self, timer: RequestTimer, now: float, num_new: int) -> None:
        labels = self._labels
        if timer.first_token is None:
            timer.first_token = now
            self["vllm:time_to_first_token_seconds"].observe(now - timer.arrival, labels)
            num_new -= 1
        if num_new > 0 and timer.last_token is not None:
            # Tokens that arrive together share the wait evenly.
            for _ in range(num_new):
                self["vllm:inter_token_latency_seconds"].observe((now - timer.last_token) / num_new, labels)
        timer.last_token = now

    def _observe_finished(self, timer: RequestTimer, now: float, output: RequestOutput) -> None:
        labels = self._labels
        num_generated = sum(len(c.token_ids) for c in output.outputs)
        self["vllm:e2e_request_latency_seconds"].observe(now - timer.arrival, labels)
        self["vllm:prompt_tokens"].inc(len(output.prompt_token_ids), labels)
        self["vllm:request_prompt_tokens"].observe(len(output.prompt_token_ids), labels)
        self["vllm:request_generation_tokens"].observe(num_generated, labels)
        if timer.num_tokens > 1 and timer.first_token is not None:
            self["vllm:request_time_per_output_token_seconds"].observe(
                (now - timer.first_token) / (timer.num_tokens - 1), labels)
        for completion in output.outputs:
            reason = completion.finish_reason or "abort"
            self["vllm:request_success"].inc(1, labels + (("finished_reason", reason),))


def _one_two_five(limit: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit``, as vLLM buckets token counts."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > limit:
                return tuple(buckets)
            buckets.append(float(mantissa * scale))
        scale *= 10


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    escaped = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, v in labels)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(labels, escaped)) + "}"


def _number(value: float) -> str:
    # As prometheus_client writes them, so bucket labels read le="5.0" exactly as vLLM's do.
    return "+Inf" if math.isinf(value) else repr(float(value))
