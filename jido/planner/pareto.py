"""Pareto plot (PNG) of cost per million tokens against TTFT p90 for planned configurations."""

from __future__ import annotations

from pathlib import Path

from jido.planner.planner import PlanResult, pareto_front


def plot_pareto(result: PlanResult, path: Path | str) -> Path:
    """Analytic estimates for every feasible configuration, simulated finalists on top."""
    import matplotlib  # lazy: only this command needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rate_tokens = result.inputs.tokens_per_second
    fig, ax = plt.subplots(figsize=(8, 5))
    for het, color in ((False, "tab:blue"), (True, "tab:orange")):
        pts = [(s.cost_per_hour / (rate_tokens * 3600) * 1e6, s.ttft_s * 1e3)
               for s in result.feasible_sizings if s.config.is_heterogeneous == het]
        if pts:
            ax.scatter(*zip(*pts), s=6, alpha=0.25, color=color,
                       label=f"{'heterogeneous' if het else 'homogeneous'} (analytic)")
    sims = [(r.cost_per_mtok, r.sim.ttft_ms["p90"]) for r in result.ranked if r.meets_slo]
    if sims:
        front = [sims[i] for i in pareto_front(sims)]
        ax.scatter(*zip(*sims), marker="x", color="black", label="simulated, meets SLO")
        ax.step(*zip(*front), where="post", color="red", label="Pareto front (simulated)")
    ax.set_xscale("log")
    ax.set_xlabel("USD per million tokens")
    ax.set_ylabel("TTFT ms (analytic: mean estimate; simulated: p90)")
    ax.set_title(f"{result.inputs.model.name} / {result.inputs.workload.name} at {result.inputs.rate:g} req/s")
    ax.legend(fontsize=8)
    out = Path(path)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return out
