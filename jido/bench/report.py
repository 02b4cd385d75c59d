"""Shows and saves results: the terminal table, the JSON file, and a one-line-per-run sweep table."""
from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jido.bench.config import BenchConfig
from jido.bench.machine import describe_machine
from jido.bench.summary import LATENCIES, PERCENTILES

_TITLES = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
           "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}
_SERVER_ROWS = (("server_mean_queue_time_ms", "Mean queue time (ms)"),
                ("server_mean_kv_cache_usage", "Mean KV cache usage"),
                ("server_max_kv_cache_usage", "Max KV cache usage"),
                ("server_prefix_cache_hit_rate", "Prefix cache hit rate"),
                ("server_mean_batch_size", "Mean batch size (requests/step)"),
                ("server_num_preemptions", "Preemptions"))
_SPEC_ROWS = (("server_spec_decode_acceptance_rate", "Spec decode acceptance rate"),
              ("server_spec_decode_mean_acceptance_length", "Mean acceptance length"))


def format_table(result: dict[str, Any]) -> str:
    """vLLM's result block, with jido's server-side figures when /metrics gave them."""
    rows = [*failure_lines(result), _banner("Serving Benchmark Result"),
            _row("Successful requests", result["completed"]), _row("Failed requests", result["failed"]),
            _row("Connections retried", result.get("num_retries", 0)),
            _row("Maximum request concurrency", result.get("max_concurrency")),
            _row("Request rate (req/s)", result.get("request_rate")),
            _row("Benchmark duration (s)", result["duration"]),
            f"Prompt lengths drawn in: {result.get('prompt_len_unit', 'words')}",
            _row("Total input tokens", result["total_input_tokens"]),
            _row("Total generated tokens", result["total_output_tokens"]),
            _row("Request throughput (req/s)", result["request_throughput"])]
    if result.get("request_goodput") is not None:
        rows.append(_row("Request goodput (req/s)", result["request_goodput"]))
    rows += [_row("Output token throughput (tok/s)", result["output_throughput"]),
             _row("Total token throughput (tok/s)", result["total_token_throughput"])]
    for name in LATENCIES:
        rows.append(_banner(_TITLES[name], "-"))
        rows += [_row(f"Mean {name.upper()} (ms)", result[f"mean_{name}_ms"]),
                 _row(f"Median {name.upper()} (ms)", result[f"median_{name}_ms"])]
        rows += [_row(f"P{p} {name.upper()} (ms)", result[f"p{p}_{name}_ms"]) for p in PERCENTILES]
    if result.get("server_metrics_available"):
        rows.append(_banner("Server /metrics over the run", "-"))
        rows += [_row(label, result.get(key)) for key, label in _SERVER_ROWS]
        for tier, counters in result.get("server_kv_offload", {}).items():
            rows += [_row(f"KV offload {tier}: hit rate", counters["hit_rate"]),
                     _row(f"KV offload {tier}: loaded MiB", counters.get("loaded_bytes", 0) / 2**20),
                     _row(f"KV offload {tier}: mean load (ms/block)", counters["mean_load_ms"]),
                     _row(f"KV offload {tier}: errors", counters.get("errors"))]
        if "server_spec_decode_num_drafts" in result:  # only from a server that speculates
            rows += [_row(label, result.get(key)) for key, label in _SPEC_ROWS]
    rows += [f"error ({e['count']}x): {e['error'][:200]}" for e in result.get("first_errors", [])]
    if result.get("machine"):
        rows.append(f"Machine: {describe_machine(result['machine'])}")
    rows.append("=" * 50)
    return "\n".join(rows)


def failure_lines(result: dict[str, Any]) -> list[str]:
    """A warning for the top of the output when requests failed: the figures then cover only the rest."""
    failed = result["failed"]
    if not failed:
        return []
    total = failed + result["completed"]
    first = result.get("first_errors") or [{"error": "unknown error"}]
    return [f"WARNING: {failed} of {total} requests FAILED; the figures below cover the {result['completed']} "
            f"that completed. First error: {first[0]['error'][:200]}"]


def format_sweep(results: Sequence[dict[str, Any]]) -> str:
    """One line per load level: concurrency, rate, throughputs, p99 TTFT and TPOT, failures."""
    header = f"{'concurrency':>11} {'rate':>6} {'req/s':>7} {'out tok/s':>9} {'p99 TTFT ms':>11} " \
             f"{'p99 TPOT ms':>11} {'failed':>6}"
    lines = [header]
    for r in results:
        lines.append(f"{str(r.get('max_concurrency') or 'inf'):>11} {str(r['request_rate']):>6} "
                     f"{r['request_throughput']:>7.2f} {r['output_throughput']:>9.1f} {_ms(r['p99_ttft_ms']):>11} "
                     f"{_ms(r['p99_tpot_ms']):>11} {r['failed']:>6}")
    lines += [f"concurrency {r.get('max_concurrency') or 'inf'}, rate {r['request_rate']}: {line}"
              for r in results for line in failure_lines(r)]
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def result_path(config: BenchConfig, sweep: bool) -> Path:
    """--result-dir/--result-filename, else a name saying dataset, load and time, as vLLM does."""
    if config.result_filename:
        name = config.result_filename
    else:
        load = (f"sweep-{'concurrency' if config.sweep_concurrency else 'rate'}" if sweep else
                f"{config.request_rate}qps-concurrency{config.max_concurrency or 'inf'}")
        name = f"jido-bench-{config.dataset_name}-{load}-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
    return Path(config.result_dir or ".") / name


def save_result(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def _banner(title: str, fill: str = "=") -> str:
    return f"{' ' + title + ' ':{fill}^50}"


def _row(label: str, value: Any) -> str:
    text = "n/a" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)
    return f"{label + ':':<40}{text:>10}"
