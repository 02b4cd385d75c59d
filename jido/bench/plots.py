"""PNG plots of a result: latency CDFs of one run, throughput and p99 TTFT versus load for a sweep."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only), imported on first use: it is slow to import."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_cdfs(result: dict[str, Any], path: Path) -> Path:
    """TTFT, TPOT, ITL and E2E latency CDFs of one run, side by side."""
    plt = pyplot()
    ok = [not e for e in result["errors"]]
    series = {"TTFT": _ms(result["ttfts"], ok), "TPOT": _ms(result["tpots"], ok),
              "ITL": [g * 1000 for gaps, good in zip(result["itls"], ok) if good for g in gaps],
              "E2E latency": _ms(result["e2els"], ok)}
    fig, axes = plt.subplots(1, len(series), figsize=(3.6 * len(series), 3.2))
    for ax, (name, values) in zip(axes, series.items()):
        values = sorted(values)
        ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], drawstyle="steps-post")
        ax.set(title=f"{name} CDF", xlabel="ms", ylabel="fraction of samples", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result['model_id']}  {result['dataset_name']}  concurrency={result['max_concurrency']}  "
                 f"rate={result['request_rate']}", fontsize=9)
    return save_figure(plt, fig, path)


def _ms(values: Sequence[float | None], ok: Sequence[bool]) -> list[float]:
    return [v * 1000 for v, good in zip(values, ok) if good and v is not None]


def plot_sweep(results: Sequence[dict[str, Any]], key: str, path: Path) -> Path:
    """Output throughput and p99 TTFT against the swept load (max_concurrency or request_rate)."""
    plt = pyplot()
    loads = [r[key] if r[key] != "inf" else float("nan") for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    left.plot(loads, [r["output_throughput"] for r in results], marker="o")
    left.set(title="output throughput", xlabel=key, ylabel="tokens/s")
    right.plot(loads, [r["p99_ttft_ms"] for r in results], marker="o", color="tab:red")
    right.set(title="p99 TTFT", xlabel=key, ylabel="ms")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    return save_figure(plt, fig, path)


# What a compare run's figure shows per workload, and which way is better.
ENGINE_PANELS = (("output_throughput", "output tokens/s (higher is better)"),
                 ("mean_ttft_ms", "mean TTFT ms (lower is better)"),
                 ("median_tpot_ms", "median TPOT ms (lower is better)"))


def plot_engines(peers: dict[str, dict[str, Any]], workloads: Sequence[str], path: Path) -> Path:
    """A compare run as bars: one panel per figure of :data:`ENGINE_PANELS`, a group per workload, a bar per engine
    (engines without a result for a workload have no bar there)."""
    plt = pyplot()
    names = [name for name, record in peers.items() if record.get("results")]
    fig, axes = plt.subplots(1, len(ENGINE_PANELS), figsize=(4.2 * len(ENGINE_PANELS), 3.6))
    width = 0.8 / max(1, len(names))
    for ax, (key, title) in zip(axes, ENGINE_PANELS):
        for i, name in enumerate(names):
            values = [(peers[name]["results"].get(w) or {}).get(key) for w in workloads]
            xs = [x + i * width for x, v in enumerate(values) if v is not None]
            ax.bar(xs, [v for v in values if v is not None], width, label=name)
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(workloads))], list(workloads))
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    return save_figure(plt, fig, path)


def save_figure(plt: Any, fig: Any, path: Path) -> Path:
    """Lay out, write the PNG (its folder made if missing), close the figure; returns ``path``."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
