"""What benchmarks/compare.py writes: one entry per engine and configuration, repeats as median and spread,
jido ÷ peer ratios, and derived lines tied to the run they derive from, as JSON and Markdown."""
from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jido.bench.machine import describe_machine

# Ratios are jido ÷ peer: above 1 is better for throughputs, below 1 is better for latencies.
RATIO_KEYS = ("output_throughput", "p99_ttft_ms", "median_tpot_ms")
COUNT_KEYS = ("completed", "failed")  # summed over repeats: a failure in any run is reported
TABLE_KEYS = ("output_throughput", "request_throughput", "mean_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
              "p99_itl_ms", "failed")
# The CPU fields a derived figure must share with the run it derives from.
CPU_KEYS = ("cpu_model", "isa", "cpu_flags")


def variant_label(engine: str, config: dict[str, Any]) -> str:
    """The result entry's key: the engine and its configuration, e.g. ``jido[dtype=bfloat16]``."""
    return engine + (f"[{','.join(f'{k}={v}' for k, v in sorted(config.items()))}]" if config else "")


def engine_of(label: str, record: dict[str, Any]) -> str:
    """The engine of an entry (entries written before variants were keyed by the engine alone)."""
    return record.get("engine") or label.split("[")[0]


def dtype_of(record: dict[str, Any]) -> str | None:
    return (record.get("config") or {}).get("dtype") or record.get("dtype")


def summarize_repeats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One workload's figures over its repeats: the median of each figure (counts summed), and with more
    than one run, `spread` = [min, max] of each figure and `repeats`."""
    summary: dict[str, Any] = {}
    spread: dict[str, list[float]] = {}
    for key in runs[0]:
        values = [run.get(key) for run in runs]
        if key in COUNT_KEYS and all(isinstance(v, int) for v in values):
            summary[key] = sum(values)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            summary[key] = statistics.median(values)
            spread[key] = [min(values), max(values)]
        elif key == "errors":
            summary[key] = sorted({e for v in values for e in (v or [])})[:3]
        else:
            summary[key] = values[-1]
    if len(runs) > 1:
        summary.update(spread=spread, repeats=len(runs))
    return summary


def ratios(records: dict[str, Any]) -> dict[str, Any]:
    """jido ÷ peer for each jido variant, each other engine and each workload both ran:
    ``{workload: {jido label: {peer label: {figure: ratio}}}}``."""
    jidos = {label: r for label, r in records.items() if engine_of(label, r) == "jido" and r.get("results")}
    table: dict[str, Any] = {}
    for peer, record in records.items():
        if engine_of(peer, record) == "jido":
            continue
        for workload, theirs in (record.get("results") or {}).items():
            for label, jido in jidos.items():
                ours = jido["results"].get(workload)
                if ours:
                    table.setdefault(workload, {}).setdefault(label, {})[peer] = {
                        key: ours[key] / theirs[key] for key in RATIO_KEYS if ours.get(key) and theirs.get(key)}
    return table


def same_cpu(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    return bool(a and b) and all(a.get(k) == b.get(k) for k in CPU_KEYS)


def roofline_shares(records: dict[str, Any], machine: dict[str, Any],
                    decode_limit: Callable[[str, dict[str, Any]], tuple[float, float, float]]) -> dict[str, Any]:
    """Each jido variant's batch-1 decode over the bandwidth limit for the dtype (and quantization) it ran with.

    `decode_limit(dtype, config)` (the variant's settings: quantization, weights_memory) gives (limit tok/s, copy bandwidth GB/s, weight MB read per token) as measured on
    `machine`, the weights as jido holds them in that dtype (quantized codes where it serves them); a variant
    measured on another CPU gets a note instead. A share over 100% means the limit was measured too small:
    it is given as None with a note, never as a figure.
    """
    shares: dict[str, Any] = {}
    for label, record in records.items():
        batch1 = (record.get("results") or {}).get("batch1") or {}
        if engine_of(label, record) != "jido" or not batch1.get("median_tpot_ms"):
            continue
        dtype = dtype_of(record) or "float32"
        if not same_cpu(record.get("machine"), machine):
            shares[label] = {"dtype": dtype, "percent_of_limit": None,
                             "note": "its CPU was not recorded or is not the one the roofline was measured on"}
            continue
        limit, bandwidth, weight_mb = decode_limit(dtype, record.get("config") or {})
        decode = 1000 / batch1["median_tpot_ms"]
        share: dict[str, Any] = {"dtype": dtype, "decode_limit_tok_s": limit, "jido_decode_tok_s": decode,
                                 "bandwidth_gb_s": bandwidth, "weight_mb": weight_mb,
                                 "percent_of_limit": 100 * decode / limit}
        if decode > limit:
            share.update(percent_of_limit=None, note=f"jido's {decode:.1f} tok/s is above the limit, so the "
                                                     "copy bandwidth was measured too small")
        shares[label] = share
    return shares


def matching_offline(results_dir: Path, record: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The newest offline_throughput result (by its recorded date) from the same day, CPU and dtype as a jido
    run, as (file name, its jido figures); None when there is none."""
    day, dtype = (record.get("date") or "")[:10], dtype_of(record)
    found = []
    for path in results_dir.glob("offline_throughput-*.json"):
        try:
            offline = json.loads(path.read_text())
        except ValueError:
            continue
        if (str(offline.get("date", ""))[:10] == day and offline.get("dtype") == dtype
                and same_cpu(offline.get("machine"), record.get("machine"))):
            found.append((str(offline["date"]), path.name, offline.get("results", {}).get("jido", {})))
    return max(found)[1:] if found else None


def jido_profile(records: dict[str, Any], results_dir: Path) -> dict[str, Any]:
    """Where each jido variant's time goes: its server's queue time per workload, and the step split of an
    offline run (benchmarks/offline_throughput.py) from the same day, CPU and dtype, if there is one."""
    profile: dict[str, Any] = {}
    for label, record in records.items():
        if engine_of(label, record) != "jido" or not record.get("results"):
            continue
        entry: dict[str, Any] = {"server_mean_queue_time_ms": {
            w: r.get("server_mean_queue_time_ms") for w, r in record["results"].items()}}
        offline = matching_offline(results_dir, record)
        if offline:
            name, runs = offline
            entry["offline_step_seconds"] = {"source": name, **{
                run: {k: v for k, v in figures.items() if k.endswith("_s") and not k.endswith("tok_s")}
                for run, figures in runs.items()}}
        profile[label] = entry
    return profile


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"# jido vs peers — {doc['date']}", "", f"Machine: {describe_machine(doc['machine'])}.",
             "Same prompts for every engine (cut from Python's pydoc text, counted with the model's tokenizer.json),"
             " greedy, EOS ignored. Ratios are jido ÷ peer. With repeats, a figure is the median and "
             "(min–max) its spread.", ""]
    for workload in doc["workloads"]:
        lines += _workload_section(doc, workload)
    lines += ["## Engines", ""]
    for name, record in doc["peers"].items():
        load = record.get("load_average_at_start")
        lines.append(f"- **{name}** ({record.get('status')}): {record.get('version', '')}"
                     + ("" if load is None else f"; load average at start {load:.2f}"))
        if record.get("memory"):
            memory = record["memory"]
            lines.append(f"  - start-up {memory['start_s']:.1f} s to ready; PSS of its processes "
                         f"{memory['pss_after_load_mib']:,.0f} MiB after load, peak {memory['peak_pss_mib']:,.0f} MiB")
        if record.get("command"):
            lines.append(f"  - command: `{record['command']}` env {record.get('env')}")
        if record.get("llama_bench"):
            lines.append(f"  - llama-bench: {record['llama_bench']}")
        if record.get("error"):
            lines += ["  - error at " + record.get("stage", "?") + ":", "", "```", record["error"], "```", ""]
    return "\n".join(lines + ["", "## Where jido's time goes", ""] + _profile_lines(doc)) + "\n"


def _profile_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    for label, roof in (doc.get("roofline") or {}).items():
        if roof.get("percent_of_limit") is None:
            lines.append(f"- {label}: batch-1 decode share of the bandwidth limit: none ({roof['note']})")
        else:
            lines.append(f"- {label}: batch-1 decode {roof['jido_decode_tok_s']:.1f} tok/s = "
                         f"{roof['percent_of_limit']:.0f}% of the {roof['decode_limit_tok_s']:.1f} tok/s bandwidth "
                         f"limit ({roof['weight_mb']:.0f} MB of weights read a token as jido holds them in "
                         f"{roof['dtype']}, {roof['bandwidth_gb_s']:.1f} GB/s copy bandwidth)")
    for label, profile in (doc.get("jido_profile") or {}).items():
        queue = {w: round(v) for w, v in profile["server_mean_queue_time_ms"].items() if v is not None}
        lines.append(f"- {label}: mean queue time in jido's server (ms): {queue}")
        offline = profile.get("offline_step_seconds")
        if not offline:
            lines.append(f"- {label}: no offline_throughput result from the same day, CPU and dtype")
        for run, figures in (offline or {}).items():
            if run != "source" and figures.get("elapsed_s"):
                shares = {k.removesuffix("_s"): f"{100 * v / figures['elapsed_s']:.1f}%" for k, v in figures.items()
                          if k not in ("elapsed_s", "ttft_s")}
                lines.append(f"- {label}: offline {run} step time ({offline['source']}; attention is inside "
                             f"model): {shares}")
    return lines


def _workload_section(doc: dict[str, Any], workload: str) -> list[str]:
    lines = [f"## {workload}", "", "| engine | out tok/s | req/s | mean TTFT ms | p99 TTFT ms | median TPOT ms "
             "| p99 ITL ms | failed |", "|---|---|---|---|---|---|---|---|"]
    errors = []
    for name, record in doc["peers"].items():
        r = (record.get("results") or {}).get(workload)
        if r:
            spread = r.get("spread", {})
            lines.append(f"| {name} | " + " | ".join(_fmt(r.get(k), spread.get(k)) for k in TABLE_KEYS) + " |")
            errors += [f"- {name} errors: {'; '.join(r['errors'])}"] if r.get("errors") else []
    lines += [""] + errors
    for jido, by_peer in doc["ratios"].get(workload, {}).items():
        for name, ratio in by_peer.items():
            lines.append(f"\n{jido} ÷ {name}: " + ", ".join(f"{k} {v:.2f}×" for k, v in ratio.items()))
    return lines + [""]


def _fmt(value: Any, spread: list[float] | None = None) -> str:
    if value is None:
        return "-"
    if not isinstance(value, float):
        return str(value)
    return f"{value:.1f}" + (f" ({spread[0]:.1f}–{spread[1]:.1f})" if spread and spread[0] != spread[1] else "")
