"""``jido bench``: flags from BenchConfig, one run or a sweep, then the table, the JSON and the plots."""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from jido.bench.config import BenchConfig
from jido.bench.corpus import Corpus
from jido.bench.datasets import sample_requests
from jido.bench.report import failure_lines, format_sweep, format_table, result_path, save_result
from jido.bench.runner import BenchError, run_benchmark
from jido.bench.tokens import WordCounter, make_counter
from jido.utils.cli_args import add_dataclass_arguments, dataclass_kwargs
from jido.utils.reference_text import reference_text

WORDS_NOTE = (" and punctuation marks, not model tokens: the server has no /tokenize and no --tokenizer was given, "
              "so --random-input-len and the other lengths are approximate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jido bench", description=(
        "Load-test any OpenAI-compatible server; flags and result keys follow `vllm bench serve`."))
    add_bench_arguments(parser)
    return parser


def add_bench_arguments(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """BenchConfig's flags (but ``skip``), SLOs spelled either way."""
    add_dataclass_arguments(parser, BenchConfig, skip=(*skip, "goodput"))
    # vLLM spells SLOs as `--goodput ttft:500 tpot:50`; `--slo ttft=500,tpot=50` is the same thing.
    parser.add_argument("--goodput", "--slo", dest="goodput", nargs="+", metavar="KEY=MS",
                        help="SLOs in ms for goodput, keys ttft, tpot, e2el: ttft=500,tpot=50 or ttft:500 tpot:50 "
                             "(default: none, no goodput)")


def config_from_args(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> BenchConfig:
    """The BenchConfig of the flags :func:`add_bench_arguments` added; ``skip``'s fields keep their defaults."""
    kwargs = dataclass_kwargs(args, BenchConfig, skip=skip)
    if kwargs.get("goodput"):
        kwargs["goodput"] = " ".join(kwargs["goodput"])
    return BenchConfig(**kwargs)


def run(config: BenchConfig) -> dict[str, Any]:
    """Run the config (every sweep point on the same prompts); a sweep's result holds one dict per point."""
    counter = make_counter(config.tokenizer, config.base_url, config.model)
    print(f"prompt lengths counted in {counter.name}"
          + (WORDS_NOTE if isinstance(counter, WordCounter) else ""), file=sys.stderr)
    requests = sample_requests(config, Corpus(reference_text(), counter))
    results = []
    for point in config.sweep_points():
        result = {**asyncio.run(run_benchmark(point, requests)), "prompt_len_unit": counter.name}
        print(format_table(result), flush=True)
        results.append(result)
    if len(results) == 1:
        return results[0]
    print(format_sweep(results))
    return {"sweep_key": _sweep_key(config), "runs": results}


def save(config: BenchConfig, result: dict[str, Any]) -> list[Path]:
    """The JSON file and, unless --no-plots, PNGs beside it; returns what was written."""
    path = result_path(config, sweep="runs" in result)
    save_result(path, result)
    written = [path]
    if config.plots:
        from jido.bench.plots import plot_cdfs, plot_sweep

        runs = result.get("runs", [result])
        written += [plot_cdfs(r, path.with_name(f"{path.stem}-cdf{i}.png")) for i, r in enumerate(runs)]
        if "runs" in result:
            written.append(plot_sweep(runs, result["sweep_key"], path.with_name(f"{path.stem}-sweep.png")))
    return written


def _sweep_key(config: BenchConfig) -> str:
    return "max_concurrency" if config.sweep_concurrency else "request_rate"


def bench_main(argv: list[str]) -> int:
    """Entry point for `jido bench ARGS`; returns the exit status."""
    try:
        config = config_from_args(build_parser().parse_args(argv))
        result = run(config)
        for line in (line for r in result.get("runs", [result]) for line in failure_lines(r)):
            print(f"jido bench: {line}", file=sys.stderr)  # again last, where it is seen when stdout is saved
        if config.save_result or config.result_filename:
            for path in save(config, result):
                print(f"wrote {path}")
    except (ValueError, FileNotFoundError, BenchError) as exc:
        print(f"jido bench: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(bench_main(sys.argv[1:]))
