"""Runs an ablation: one `jido serve` at a time per technique value, the same `jido bench` workload against each.

Every server serves the baseline (jido's default for each technique) with at most one technique changed. A
round runs the baseline and then every variant once; ``repeats`` rounds, so slow drift in the machine spreads
over all of them. Each run starts a fresh server (an empty prefix cache), warms it up with short prompts that
are not the run's, times the workload, and stops the server before the next one starts.
"""
from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from jido.bench.config import BenchConfig
from jido.bench.corpus import Corpus
from jido.bench.datasets import SampleRequest, sample_requests
from jido.bench.runner import BenchError, run_benchmark
from jido.bench.tokens import make_counter
from jido.tools.ablate.config import AblateConfig
from jido.tools.ablate.results import Ablation, Arm, run_metrics
from jido.tools.ablate.serve import ServerStartError, serving
from jido.tools.ablate.techniques import missing, select
from jido.utils.reference_text import reference_text

WARMUP_INPUT_LEN, WARMUP_OUTPUT_LEN = 128, 16


class AblateError(RuntimeError):
    """The ablation cannot go on: the baseline server does not start or serve."""


def plan(config: AblateConfig, options: dict[str, tuple[str, ...] | None]) -> Ablation:
    """The baseline and variant servers for the selected techniques this `jido serve` (``options``) can run.

    A technique whose baseline or off value needs a flag or choice serve lacks is unavailable as a whole;
    any other value it lacks is unavailable alone.
    """
    common = (*(("--model", config.model) if config.model else ()), *config.common_serve_args)
    techniques, variants, unavailable = [], [], []
    for technique in select(config.techniques):
        needed = dict.fromkeys((technique.off.value, technique.baseline))
        reason = next(filter(None, (missing(technique.setting(v).serve_args, options) for v in needed)), None)
        if reason is not None:
            unavailable += [{"technique": technique.name, "value": s.value, "reason": reason}
                            for s in technique.values if s.value != technique.baseline]
            continue
        techniques.append(technique)
        for setting in technique.values:
            if setting.value == technique.baseline:
                continue
            reason = missing(setting.serve_args, options)
            if reason is None:
                variants.append(Arm(technique.name, setting.value, setting.serve_args))
            else:
                unavailable.append({"technique": technique.name, "value": setting.value, "reason": reason})
    baseline_args = tuple(a for t in techniques for a in t.setting(t.baseline).serve_args)
    baseline = Arm(None, "baseline", (*common, *baseline_args))
    # A variant's own flags come last, so they override the baseline's for its technique.
    for arm in variants:
        arm.serve_args = (*baseline.serve_args, *arm.serve_args)
    return Ablation(techniques, baseline, variants, unavailable)


class Runner:
    """Runs the plan's servers one after another, writing the results out after every run."""

    def __init__(self, config: AblateConfig, bench: BenchConfig, ablation: Ablation, log_dir: Path,
                 on_run: Callable[[Ablation], None]) -> None:
        self.config, self.bench, self.ablation, self.log_dir = config, bench, ablation, log_dir
        self.on_run = on_run  # called after every run, with what has been measured so far
        self.requests: list[SampleRequest] | None = None  # drawn once, from the first server's tokenizer
        self.warmups: list[SampleRequest] = []
        self._durations: list[float] = []
        self._timed_out: list[Arm] = []  # not run again: a later round would only wait as long

    def run(self) -> Ablation:
        """Every round's runs; a Ctrl-C stops the server running and keeps what was measured (``interrupted``)."""
        schedule = [(r, arm) for r in range(self.config.repeats)
                    for arm in (self.ablation.baseline, *self.ablation.variants)]
        try:
            for index, (repeat, arm) in enumerate(schedule):
                if not self._will_run(arm):
                    continue  # timed out, or found unavailable, in an earlier round
                self._progress(sum(self._will_run(a) for _, a in schedule[index:]), arm, repeat)
                self._measure(arm, repeat, index)
                self.on_run(self.ablation)
        except KeyboardInterrupt:
            self.ablation.interrupted = True
            print("\njido ablate: interrupted; keeping the runs measured so far", file=sys.stderr)
        return self.ablation

    def _will_run(self, arm: Arm) -> bool:
        return arm not in self._timed_out and arm in (self.ablation.baseline, *self.ablation.variants)

    def _progress(self, num_left: int, arm: Arm, repeat: int) -> None:
        """The run starting, and the time so far and to go (the mean run so far times the runs left)."""
        elapsed, num_done = sum(self._durations), len(self._durations)
        eta = f", about {_clock(elapsed / num_done * num_left)} left" if num_done else ""
        print(f"jido ablate: run {num_done + 1} of {num_done + num_left}: {arm.label} (repeat {repeat + 1} of "
              f"{self.config.repeats}); {_clock(elapsed)} elapsed{eta}", file=sys.stderr, flush=True)

    def _measure(self, arm: Arm, repeat: int, index: int) -> None:
        start = time.monotonic()
        log = self.log_dir / f"{index + 1:03d}-{_file_part(arm.label)}-r{repeat + 1}.log"
        try:
            with serving(arm.serve_args, log, self.config.server_start_timeout_s) as base_url:
                result = asyncio.run(self._timed(replace(self.bench, base_url=base_url), arm, repeat))
            arm.runs.append(run_metrics(result))
            print(f"jido ablate: {arm.label}: {_headline(result)}", file=sys.stderr, flush=True)
        except (ServerStartError, BenchError) as exc:
            self._refused(arm, f"{exc} (log: {log})")
        except TimeoutError:
            reason = f"warm-up and run took longer than {self.config.run_timeout_s:g} s (log: {log})"
            if arm is self.ablation.baseline and not arm.runs:
                raise AblateError(f"the baseline server timed out: {reason}") from None
            arm.errors.append(reason)
            self._timed_out.append(arm)
        finally:
            self._durations.append(time.monotonic() - start)

    def _refused(self, arm: Arm, reason: str) -> None:
        """A server that would not start or serve: the baseline stops the ablation, a variant is unavailable."""
        if arm.runs:
            arm.errors.append(reason)
        elif arm is self.ablation.baseline:
            raise AblateError(f"the baseline server ({' '.join(arm.serve_args) or 'no flags'}) failed: {reason}")
        else:
            self.ablation.variants.remove(arm)
            self.ablation.unavailable.append({"technique": arm.technique, "value": arm.value, "reason": reason})
            print(f"jido ablate: {arm.label} is unavailable: {reason}", file=sys.stderr, flush=True)

    async def _timed(self, bench: BenchConfig, arm: Arm, repeat: int) -> dict[str, Any]:
        if self.requests is None:
            await asyncio.to_thread(self._draw_requests, bench)

        async def warm_then_run() -> dict[str, Any]:
            if self.warmups:
                await run_benchmark(replace(bench, disable_tqdm=True, goodput=None), self.warmups)
            return await run_benchmark(bench, self.requests, f"{arm.label} [{repeat + 1}/{self.config.repeats}]")

        return await asyncio.wait_for(warm_then_run(), self.config.run_timeout_s)

    def _draw_requests(self, bench: BenchConfig) -> None:
        """The run's prompts, the same for every server, and the warm-up's (other windows of the same text)."""
        counter = make_counter(bench.tokenizer, bench.base_url, bench.model)
        print(f"jido ablate: prompt lengths counted in {counter.name}", file=sys.stderr, flush=True)
        corpus = Corpus(reference_text(), counter)
        self.requests = sample_requests(bench, corpus)
        num_warmups = self.config.num_warmups
        if num_warmups is None:
            num_warmups = bench.max_concurrency or 8
        if num_warmups:
            warm = replace(bench, dataset_name="random", num_prompts=num_warmups, seed=bench.seed + 1,
                           random_input_len=WARMUP_INPUT_LEN, random_output_len=WARMUP_OUTPUT_LEN,
                           random_range_ratio=0.5)
            self.warmups = sample_requests(warm, corpus)


def _headline(result: dict[str, Any]) -> str:
    failed = f", {result['failed']} FAILED" if result["failed"] else ""
    ttft = result.get("p99_ttft_ms")
    return (f"{result['output_throughput']:.1f} output tok/s, p99 TTFT "
            f"{'n/a' if ttft is None else f'{ttft:.0f} ms'}, {result['duration']:.0f} s{failed}")


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def _file_part(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)

