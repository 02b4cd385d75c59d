"""`jido doctor`: name the serving bottleneck from a bench result or /metrics, with evidence and a knob."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from jido.planner.prometheus import Metrics
from jido.planner.workloads import Slo

DEFAULT_SLO = Slo(ttft_ms=1000.0, tpot_ms=50.0)
LONG_PROMPT_TOKENS = 2000
TAIL_RATIO = 3.0


@dataclass(frozen=True)
class Observations:
    """What was measured; None where the source did not say. Latencies in ms, usage as a 0-1 fraction."""

    completed: float | None = None
    request_throughput: float | None = None
    output_throughput: float | None = None
    mean_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    p99_itl_ms: float | None = None
    mean_queue_time_ms: float | None = None
    kv_cache_usage: float | None = None
    num_preemptions: float | None = None
    prefix_cache_hit_rate: float | None = None
    mean_input_len: float | None = None
    mean_output_len: float | None = None
    num_requests_waiting: float | None = None
    num_requests_running: float | None = None
    kv_offload_hit_rate: float | None = None  # blocks found in the offload tiers / looked up; None: no tier
    kernel_fallbacks: float | None = None  # C++ kernel libraries on their PyTorch fallbacks (jido's /metrics)

    def __post_init__(self) -> None:
        if self.kv_cache_usage is not None and not 0 <= self.kv_cache_usage <= 1:
            raise ValueError(f"kv_cache_usage must be a fraction in [0, 1], got {self.kv_cache_usage}")

    def known(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


# jido bench's keys for what the server's /metrics said over the run, by the observation each one gives.
_BENCH_SERVER_KEYS = {"mean_queue_time_ms": "server_mean_queue_time_ms", "kv_cache_usage": "server_max_kv_cache_usage",
                      "num_preemptions": "server_num_preemptions",
                      "prefix_cache_hit_rate": "server_prefix_cache_hit_rate",
                      "num_requests_waiting": "server_mean_num_requests_waiting",
                      "num_requests_running": "server_mean_num_requests_running"}


def observations_from_bench(result: Mapping[str, Any]) -> Observations:
    """Keys as in `vllm bench serve` / `jido bench` result JSON (its ``server_*`` keys where the plain one is
    missing: the KV usage is the run's peak); unknown keys are ignored."""
    names = {f.name for f in fields(Observations)}
    values = {k: float(v) for k, v in result.items() if k in names and _is_number(v)}
    for name, key in _BENCH_SERVER_KEYS.items():
        if name not in values and _is_number(result.get(key)):
            values[name] = float(result[key])
    completed = result.get("completed")
    if "mean_input_len" not in values and completed and "total_input_tokens" in result:
        values["mean_input_len"] = result["total_input_tokens"] / completed
    if "mean_output_len" not in values and completed and "total_output_tokens" in result:
        values["mean_output_len"] = result["total_output_tokens"] / completed
    tiers = result.get("server_kv_offload") or {}
    hits = sum(t.get("hits") or 0 for t in tiers.values())
    looked_up = hits + sum(t.get("misses") or 0 for t in tiers.values())
    if looked_up:
        values["kv_offload_hit_rate"] = hits / looked_up
    if values.get("kv_cache_usage", 0) > 1:  # given in percent
        values["kv_cache_usage"] /= 100
    return Observations(**values)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def observations_from_metrics(m: Metrics) -> Observations:
    """vLLM metric names (v0 and v1 spellings); histograms give means and p99."""
    ttft = "vllm:time_to_first_token_seconds"
    itl = _first_present(m, "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
    tpot = _first_present(m, "vllm:request_time_per_output_token_seconds") or itl
    usage = m.total("vllm:kv_cache_usage_perc")
    usage = m.total("vllm:gpu_cache_usage_perc") if usage is None else usage
    queries = m.total("vllm:prefix_cache_queries") or m.total("vllm:gpu_prefix_cache_queries")
    hits = m.total("vllm:prefix_cache_hits") or m.total("vllm:gpu_prefix_cache_hits")
    offload_hits, offload_misses = m.total("jido:kv_offload_hits"), m.total("jido:kv_offload_misses")
    offload_looked_up = (offload_hits or 0) + (offload_misses or 0)
    return Observations(
        kernel_fallbacks=m.total("jido:kernel_fallbacks"),
        kv_offload_hit_rate=offload_hits / offload_looked_up if offload_looked_up else None,
        completed=m.total("vllm:request_success"),
        mean_ttft_ms=_ms(m.histogram_mean(ttft)),
        p99_ttft_ms=_ms(m.histogram_quantile(ttft, 0.99)),
        mean_tpot_ms=_ms(m.histogram_mean(tpot)) if tpot else None,
        p99_tpot_ms=_ms(m.histogram_quantile(tpot, 0.99)) if tpot else None,
        p99_itl_ms=_ms(m.histogram_quantile(itl, 0.99)) if itl else None,
        mean_queue_time_ms=_ms(m.histogram_mean("vllm:request_queue_time_seconds")),
        kv_cache_usage=usage / 100 if usage is not None and usage > 1 else usage,
        num_preemptions=m.total("vllm:num_preemptions"),
        prefix_cache_hit_rate=hits / queries if queries and hits is not None else None,
        mean_input_len=m.histogram_mean("vllm:request_prompt_tokens"),
        mean_output_len=m.histogram_mean("vllm:request_generation_tokens"),
        num_requests_waiting=m.total("vllm:num_requests_waiting"),
        num_requests_running=m.total("vllm:num_requests_running"),
    )


def _first_present(m: Metrics, *names: str) -> str | None:
    return next((n for n in names if f"{n}_count" in m.samples), None)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


@dataclass(frozen=True)
class Finding:
    """One diagnosis: how strongly it applies, the numbers behind it, and what to try next."""

    name: str
    score: float
    summary: str
    evidence: tuple[str, ...]
    knobs: tuple[str, ...]
    root_cause: bool = False  # explains the latency symptoms, so it outranks them


def _fmt(obs: Observations, *names: str) -> tuple[str, ...]:
    values = obs.known()
    return tuple(f"{n}={values[n]:.4g}" for n in names if n in values)


def _kernels_on_fallback(o: Observations, slo: Slo) -> Finding | None:
    """C++ kernels that failed to build: every step runs slower than it should, whatever else is measured."""
    if not o.kernel_fallbacks:
        return None
    return Finding("kernels-missing", 10.0 + o.kernel_fallbacks,
                   "C++ kernel libraries failed to build, and their PyTorch fallbacks (several times slower) run "
                   "every step", _fmt(o, "kernel_fallbacks", "mean_tpot_ms", "mean_ttft_ms"),
                   ("run `jido build-kernels`: it names each library that fails and keeps the compiler's output",
                    "the server's /metrics names them: jido:kernel_fallback_info{library=...,fallback=...}"),
                   root_cause=True)


def _memory_pressure(o: Observations, slo: Slo) -> Finding | None:
    preempted = (o.num_preemptions or 0) > 0
    full = (o.kv_cache_usage or 0) >= 0.9
    if not (preempted or full):
        return None
    share = (o.num_preemptions or 0) / max(o.completed or 1, 1)
    return Finding("kv-memory-pressure", 1.0 + 10 * share + 5 * max(0.0, (o.kv_cache_usage or 0) - 0.9),
                   "the KV cache is full: requests are preempted and recomputed under concurrency",
                   _fmt(o, "num_preemptions", "completed", "kv_cache_usage", "mean_input_len", "num_requests_running"),
                   ("--kv-cache-dtype fp8 (halves KV bytes per token)", "lower --max-model-len or --max-num-seqs",
                    "raise --gpu-memory-utilization, or add memory (TP, a bigger device, CPU offload)"),
                   root_cause=True)


def _batching_limit(o: Observations, slo: Slo) -> Finding | None:
    queued = (o.num_requests_waiting or 0) > 0 or (o.mean_queue_time_ms or 0) > 0.5 * slo.ttft_ms
    if not queued or o.kv_cache_usage is None or o.kv_cache_usage >= 0.5:
        return None
    pressure = (o.mean_queue_time_ms or 0) / slo.ttft_ms + (o.num_requests_waiting or 0) / 10
    return Finding("batching-limit", 1.0 + pressure,
                   "requests wait in the queue while the KV cache sits mostly empty: the batch is capped",
                   _fmt(o, "num_requests_waiting", "mean_queue_time_ms", "kv_cache_usage", "num_requests_running"),
                   ("raise --max-num-seqs", "raise --max-num-batched-tokens (token budget per step)"),
                   root_cause=True)


def _slow_first_token(o: Observations, slo: Slo) -> Finding | None:
    ttft = o.p99_ttft_ms if o.p99_ttft_ms is not None else o.mean_ttft_ms
    if ttft is None or ttft <= slo.ttft_ms:
        return None
    score = ttft / slo.ttft_ms
    queue = o.mean_queue_time_ms
    if queue is not None and o.mean_ttft_ms and queue >= 0.5 * o.mean_ttft_ms:
        return Finding("prefill-queueing", score, "first tokens are late because prompts wait in the queue",
                       _fmt(o, "mean_ttft_ms", "p99_ttft_ms", "mean_queue_time_ms", "num_requests_waiting"),
                       ("add prefill capacity (more replicas or prefill instances; see `jido plan`)",
                        "admission control / rate limiting at the load balancer"))
    long_prompts = (o.mean_input_len or 0) >= LONG_PROMPT_TOKENS
    if long_prompts and (o.prefix_cache_hit_rate is None or o.prefix_cache_hit_rate < 0.3):
        return Finding("prefill-compute-no-prefix-reuse", score,
                       "first tokens are late on long prompts that the prefix cache does not reuse",
                       _fmt(o, "mean_ttft_ms", "p99_ttft_ms", "mean_input_len", "prefix_cache_hit_rate"),
                       ("--enable-prefix-caching and put shared context (system prompt, documents) first",
                        "--enable-chunked-prefill so long prompts do not block the step"))
    return Finding("prefill-compute", score, "first tokens are late: prompt processing is slow",
                   _fmt(o, "mean_ttft_ms", "p99_ttft_ms", "mean_input_len", "prefix_cache_hit_rate"),
                   ("--enable-chunked-prefill with a larger --max-num-batched-tokens",
                    "FP8 weights or a faster prefill accelerator (`jido plan`)"))


def _slow_decode(o: Observations, slo: Slo) -> Finding | None:
    tpot = o.mean_tpot_ms
    if tpot is None or tpot <= slo.tpot_ms:
        return None
    knobs = ["--speculative-config (draft model or n-gram) to emit several tokens per step",
             "FP8/INT8 weights: decode reads every weight each step"]
    if (o.mean_input_len or 0) >= LONG_PROMPT_TOKENS:
        knobs.insert(0, "--kv-cache-dtype fp8: long contexts make KV reads dominate the step")
    if (o.num_requests_running or 0) >= 64:
        knobs.insert(0, "lower --max-num-seqs or add decode capacity: the decode batch is too large")
    return Finding("slow-decode", tpot / slo.tpot_ms, "token-to-token latency is over the SLO: decode is "
                   "bound by reading weights and KV", _fmt(o, "mean_tpot_ms", "p99_tpot_ms", "p99_itl_ms",
                                                           "num_requests_running", "mean_input_len"), tuple(knobs))


def _tail_latency(o: Observations, slo: Slo) -> Finding | None:
    ratios = []
    if o.mean_ttft_ms and o.p99_ttft_ms:
        ratios.append(o.p99_ttft_ms / o.mean_ttft_ms)
    if o.mean_tpot_ms and (o.p99_itl_ms or o.p99_tpot_ms):
        ratios.append((o.p99_itl_ms or o.p99_tpot_ms) / o.mean_tpot_ms)
    worst = max(ratios, default=0.0)
    if worst < TAIL_RATIO:
        return None
    return Finding("tail-latency", 0.8 * worst / TAIL_RATIO,
                   "throughput and means look fine but p99 is far above the mean: some requests stall behind "
                   "long prompts", _fmt(o, "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms",
                                        "request_throughput"),
                   ("lower --max-num-batched-tokens so one long prefill chunk cannot stall decode steps",
                    "isolate long requests (a separate pool, or P/D disaggregation)"))


def _evicted_prefixes(o: Observations, slo: Slo) -> Finding | None:
    """Long prompts that miss the prefix cache while the pool is full: repeated prefixes are being evicted."""
    long_prompts = (o.mean_input_len or 0) >= LONG_PROMPT_TOKENS / 2
    missing = o.prefix_cache_hit_rate is not None and o.prefix_cache_hit_rate < 0.5
    full = (o.kv_cache_usage or 0) >= 0.8 or (o.num_preemptions or 0) > 0
    if not (long_prompts and missing and full):
        return None
    if o.kv_offload_hit_rate is None:
        knobs = ("--kv-offload '{\"cpu\": \"4GiB\"}': evicted prefixes come back from host memory instead of "
                 "being recomputed (add \"disk\" or a shared \"remote\" Redis for more)",
                 "POST /v1/cache to pin documents that many requests ask about (cache-augmented generation)",
                 "--scheduling-policy lpm: serve the requests whose prefix is cached first")
    else:
        knobs = ("raise the offload tiers' sizes (--kv-offload): their hit rate is low",
                 "POST /v1/cache to pin the documents asked about most",
                 "--scheduling-policy lpm: serve the requests whose prefix is cached first")
    return Finding("prefixes-evicted", 1.0 + (0.5 - o.prefix_cache_hit_rate),
                   "long prompts miss the prefix cache while the KV pool is full: shared prefixes are evicted "
                   "before they are asked for again",
                   _fmt(o, "mean_input_len", "prefix_cache_hit_rate", "kv_cache_usage", "num_preemptions",
                        "kv_offload_hit_rate"), knobs)


RULES: tuple[Callable[[Observations, Slo], Finding | None], ...] = (
    _kernels_on_fallback, _memory_pressure, _batching_limit, _slow_first_token, _slow_decode, _tail_latency, _evicted_prefixes)


def diagnose(obs: Observations, slo: Slo = DEFAULT_SLO) -> list[Finding]:
    """Every finding that applies, root causes first, then strongest first; 'healthy' when none does."""
    findings = sorted(filter(None, (rule(obs, slo) for rule in RULES)), key=lambda f: (not f.root_cause, -f.score))
    if findings:
        return findings
    return [Finding("healthy", 0.0, "no bottleneck: latencies are within the SLO and nothing queues or preempts",
                    _fmt(obs, "mean_ttft_ms", "mean_tpot_ms", "request_throughput", "kv_cache_usage"), ())]


def findings_to_dict(obs: Observations, findings: list[Finding], slo: Slo) -> dict[str, Any]:
    return {
        "bottleneck": findings[0].name,
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
        "observations": obs.known(),
        "findings": [{"name": f.name, "score": f.score, "root_cause": f.root_cause, "summary": f.summary,
                      "evidence": list(f.evidence), "knobs": list(f.knobs)} for f in findings],
    }


def format_findings(data: dict[str, Any]) -> str:
    lines = [f"bottleneck: {data['bottleneck']}"]
    for f in data["findings"]:
        lines.append(f"- {f['name']} (score {f['score']:.2f}): {f['summary']}")
        if f["evidence"]:
            lines.append(f"    because {', '.join(f['evidence'])}")
        for knob in f["knobs"]:
            lines.append(f"    try: {knob}")
    return "\n".join(lines)
