"""`jido ablate`: flags from AblateConfig and BenchConfig; plan, run, then the table, JSON, PNG and the order."""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import sys
from pathlib import Path
from typing import Any

from jido.bench.cli import add_bench_arguments, config_from_args
from jido.bench.config import BenchConfig
from jido.bench.machine import machine_info, now_iso
from jido.bench.report import save_result
from jido.tools.ablate.config import AblateConfig
from jido.tools.ablate.report import format_report, summarize, to_json
from jido.tools.ablate.results import Ablation
from jido.tools.ablate.runner import AblateError, Runner, plan
from jido.tools.ablate.serve import ServerStartError, serve_options
from jido.tools.ablate.techniques import TECHNIQUES
from jido.utils.cli_args import add_dataclass_arguments, dataclass_kwargs

# BenchConfig fields the ablation sets itself: the servers it starts, and where results go.
_BENCH_OWN = ("base_url", "model", "sweep_concurrency", "sweep_rate", "save_result", "result_dir", "result_filename",
              "plots")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jido ablate", description=(
        "Which serving techniques pay on a workload: `jido serve` with each technique's values in turn (one "
        "server at a time, everything else at jido's defaults), the same `jido bench` workload against each."),
        epilog="techniques: " + ", ".join(f"{t.name} ({'/'.join(s.value for s in t.values)})"
                                          for t in TECHNIQUES.values()))
    add_dataclass_arguments(parser, AblateConfig)
    add_bench_arguments(parser, skip=_BENCH_OWN)
    return parser


def ablate_main(argv: list[str]) -> int:
    """Entry point for `jido ablate ARGS`; returns the exit status (130 after Ctrl-C, with the results kept)."""
    try:
        args = build_parser().parse_args(argv)
        config = AblateConfig(**dataclass_kwargs(args, AblateConfig))
        bench = config_from_args(args, skip=_BENCH_OWN)
        result_path = Path(config.result_file or _default_name(bench))
        log_dir = Path(config.log_dir) if config.log_dir else result_path.with_name(result_path.stem + "-logs")
        ablation = plan(config, serve_options())
        header = _header(config, bench, log_dir)
        print(f"jido ablate: {1 + len(ablation.variants)} server configurations x {config.repeats} repeats; "
              f"{len(ablation.unavailable)} unavailable; results in {result_path}, logs in {log_dir}",
              file=sys.stderr, flush=True)
        runner = Runner(config, bench, ablation, log_dir, lambda a: _write(a, config, bench, header, result_path))
        ablation = runner.run()
    except (ValueError, AblateError, ServerStartError) as exc:
        print(f"jido ablate: error: {exc}", file=sys.stderr)
        return 2
    summary = summarize(ablation, bench, config)
    _write(ablation, config, bench, header, result_path)
    print(format_report(ablation, summary, config.min_gain, header["machine"]))
    written = [result_path]
    if config.plots and any(arm.runs for arm in ablation.variants):
        from jido.tools.ablate.plot import plot_ratios

        written.append(plot_ratios(ablation, result_path.with_suffix(".png")))
    print("\n".join(f"wrote {path}" for path in written))
    return 130 if ablation.interrupted else 0


def _write(ablation: Ablation, config: AblateConfig, bench: BenchConfig, header: dict[str, Any], path: Path) -> None:
    save_result(path, to_json(ablation, summarize(ablation, bench, config), header))


def _header(config: AblateConfig, bench: BenchConfig, log_dir: Path) -> dict[str, Any]:
    # JSON has no infinity; vLLM writes the string "inf" for an unbounded request rate.
    workload = {k: "inf" if v == math.inf else v for k, v in dataclasses.asdict(bench).items() if k not in _BENCH_OWN}
    return {"date": now_iso(), "machine": machine_info(), "model": config.model, "techniques": config.techniques,
            "repeats": config.repeats, "min_gain": config.min_gain, "serve_args": config.serve_args,
            "workload": workload, "log_dir": str(log_dir)}


def _default_name(bench: BenchConfig) -> str:
    return f"jido-ablate-{bench.dataset_name}-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"


if __name__ == "__main__":
    sys.exit(ablate_main(sys.argv[1:]))
