"""AblateConfig: what `jido ablate` compares, how often, and where its results go; the workload is `jido bench`'s."""
from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from jido.config import check_positive_int
from jido.tools.ablate.results import METRICS
from jido.tools.ablate.techniques import select


@dataclass(frozen=True)
class AblateConfig:
    """Which techniques to compare and how; the servers and the runs around the `jido bench` workload."""

    model: str | None = None
    """The model every server serves, as `jido serve --model` takes it (default: jido's default model)."""
    techniques: str | None = None
    """Comma list of techniques to compare, like prefix-caching,batching (default: every registered one)."""
    repeats: int = 3
    """Timed runs per server configuration, each on a fresh server; medians and [min, max] are reported."""
    serve_args: str = ""
    """Flags every server gets before its technique's own, like "--kv-cache-memory 1GiB" (default: none)."""
    num_warmups: int | None = None
    """Warm-up requests (short random prompts, not the run's) before each timed run (default: --max-concurrency,
    else 8)."""
    gain_metric: str | None = None
    """The figure a technique must improve to pay, a metric key like output_throughput or p99_ttft_ms (default:
    request_goodput under --goodput, else output_throughput)."""
    min_gain: float = 0.05
    """A technique pays when its best value beats the technique off by this fraction (and, with repeats, every
    run of it beats every run off)."""
    result_file: str | None = None
    """The JSON written after every run (default: jido-ablate-DATASET-TIME.json in the current folder); the PNG
    goes beside it."""
    plots: bool = True
    """A PNG of every variant's ratios to the baseline beside the result file."""
    log_dir: str | None = None
    """Folder for each server's log (default: beside the result file, named after it)."""
    server_start_timeout_s: float = 600.0
    """Seconds a server may take to listen (the first load of a model converts it)."""
    run_timeout_s: float | None = None
    """Seconds one server's warm-up and timed run may take before they are given up (default: no limit)."""

    def __post_init__(self) -> None:
        select(self.techniques)
        check_positive_int("repeats", self.repeats)
        if self.gain_metric is not None and self.gain_metric not in METRICS:
            raise ValueError(f"gain_metric must be one of {', '.join(METRICS)}, got {self.gain_metric!r}")
        if self.num_warmups is not None and (isinstance(self.num_warmups, bool) or self.num_warmups < 0):
            raise ValueError(f"num_warmups must be an integer >= 0, got {self.num_warmups!r}")
        if not 0 <= self.min_gain < math.inf:
            raise ValueError(f"min_gain must be a fraction >= 0 like 0.05, got {self.min_gain!r}")
        for name in ("server_start_timeout_s", "run_timeout_s"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self.common_serve_args  # noqa: B018 - parse once here, so bad quoting fails before any server starts

    @property
    def common_serve_args(self) -> tuple[str, ...]:
        try:
            return tuple(shlex.split(self.serve_args))
        except ValueError as exc:
            raise ValueError(f"serve_args {self.serve_args!r}: {exc}") from None
