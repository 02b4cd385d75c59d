"""The ablation's PNG: one bar group per metric, one bar per variant, its height the ratio to the baseline."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from jido.bench.plots import pyplot, save_figure
from jido.tools.ablate.report import COLUMNS
from jido.tools.ablate.results import Ablation, ratio


def plot_ratios(ablation: Ablation, path: Path) -> Path:
    """Bars of each measured variant's median ratio to the baseline per metric, whiskers from its fastest to
    its slowest run, drawn from the baseline's 1 on a log scale: a 2x and a 0.5x are bars of one length, and
    a 20x TTFT (static batching) leaves the 1.1x gains readable."""
    plt = pyplot()
    arms = [arm for arm in ablation.variants if arm.runs]
    baseline = ablation.baseline.medians()
    fig, ax = plt.subplots(figsize=(max(8.0, 1.2 * len(COLUMNS) + 0.12 * len(arms) * len(COLUMNS)), 4.8))
    width = 0.8 / max(len(arms), 1)
    groups = np.arange(len(COLUMNS))
    colors = plt.get_cmap("tab20")
    for i, arm in enumerate(arms):
        medians, spreads = arm.medians(), arm.spreads()
        heights = [ratio(medians[key], baseline.get(key)) for key, _ in COLUMNS]
        lows = [ratio(s[0], baseline.get(key)) if (s := spreads[key]) else None for key, _ in COLUMNS]
        highs = [ratio(s[1], baseline.get(key)) if (s := spreads[key]) else None for key, _ in COLUMNS]
        shown = [h if h is not None else np.nan for h in heights]
        errors = [[max(h - lo, 0) if None not in (h, lo) else 0 for h, lo in zip(heights, lows)],
                  [max(hi - h, 0) if None not in (h, hi) else 0 for h, hi in zip(heights, highs)]]
        ax.bar(groups - 0.4 + width * (i + 0.5), [h - 1.0 for h in shown], width, bottom=1.0, yerr=errors,
               capsize=2, label=arm.label, color=colors(i % 20))
    ax.set_yscale("log", base=2)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(groups, [title for _, title in COLUMNS])
    ax.set_ylabel("ratio to the baseline")
    ax.set_title("jido ablate: each variant / baseline (tok/s, goodput: higher is better; latencies, KV: lower)",
                 fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_figure(plt, fig, path)
