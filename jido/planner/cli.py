"""Entry points for `jido plan` and `jido doctor`; axis and effort flags are generated from the dataclasses."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from jido.planner.calibration import (CALIBRATION_PATH, apply_calibration, fit_ring_all_reduce, read_calibration,
                                      save_calibration)
from jido.planner.catalog import DATA_PATH, load_catalog
from jido.planner.design_space import SearchSpace
from jido.planner.doctor import (DEFAULT_SLO, diagnose, findings_to_dict, format_findings,
                                 observations_from_bench, observations_from_metrics)
from jido.planner.explain import explain
from jido.planner.model_shapes import load_model
from jido.planner.planner import PlanSettings, plan
from jido.planner.prometheus import fetch_metrics, parse_metrics
from jido.planner.report import explanation_to_dict, format_explanation, format_plan, plan_to_dict
from jido.planner.sizing import PlanInputs
from jido.planner.workloads import Slo, load_workload


def _add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, title: str) -> None:
    """One flag per field: tuples take comma-separated values, scalars their default's type."""
    group = parser.add_argument_group(title)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, tuple):
            shown = ",".join(f.default) or "all in the catalog"
            group.add_argument(flag, dest=f.name, type=_comma_list, default=None, help=f"comma list (default {shown})")
        else:
            group.add_argument(flag, dest=f.name, type=type(f.default), default=None, help=f"default {f.default}")


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _from_flags(cls: type, args: argparse.Namespace) -> Any:
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if getattr(args, f.name) is not None}
    return cls(**given)


def _prices(items: list[str]) -> dict[str, float]:
    prices = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            prices[name] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"--price {item!r}: expected ACCELERATOR=USD_PER_HOUR, like H100-SXM=2.5")
    return prices


def plan_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jido plan", description="Rank heterogeneous and homogeneous P/D "
                                "deployments by cost per token under latency SLOs.")
    p.add_argument("--model", default="llama-3.1-8b", help="catalog name or path to an HF config.json")
    p.add_argument("--workload", default="chat", help="rag, chat, codegen, batch, or a workload JSON file")
    p.add_argument("--slo", default="", help="ttft=MS,tpot=MS (p90); default: the workload's")
    p.add_argument("--rate", type=float, default=None, help="requests per second; default: the workload's")
    p.add_argument("--price", action="append", default=[], metavar="NAME=USD", help="override an hourly price")
    p.add_argument("--catalog", default=str(DATA_PATH), help="hardware data file")
    p.add_argument("--whole-transfer", action="store_true", help="send KV after prefill, not layer by layer")
    p.add_argument("--pareto", metavar="PNG", help="write a Pareto plot of cost per token against TTFT p90")
    p.add_argument("--explain", metavar="CONFIG", help="show the arithmetic for one config label")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="with --explain: at least this TP degree (default: the smallest that fits)")
    p.add_argument("--calibrate", metavar="MEASURED.json",
                   help="measured figures, by what the file holds: all-reduces (benchmarks/parallel_step.py "
                        "--calibration-out) fit the accelerator's TP link and are kept for later plans; links and "
                        "wire formats (benchmarks/disagg_transfer.py) join the catalog for this plan (name them "
                        "with --links and --wires)")
    p.add_argument("--calibration-file", default=str(CALIBRATION_PATH),
                   help="where calibrations are kept and read from (default %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_dataclass_flags(p, SearchSpace, "design space axes")
    _add_dataclass_flags(p, PlanSettings, "simulation effort")
    return p


def _inputs(args: argparse.Namespace) -> PlanInputs:
    workload = load_workload(args.workload)
    catalog = load_catalog(args.catalog).with_prices(_prices(args.price))
    catalog = apply_calibration(catalog, read_calibration(Path(args.calibration_file)))
    if args.calibrate:
        measured = json.loads(Path(args.calibrate).read_text())
        catalog = catalog.with_calibration(measured.get("calibration", measured))
    return PlanInputs(load_model(args.model), workload, Slo.parse(args.slo, workload.slo),
                      args.rate or workload.rate, catalog, layerwise=not args.whole_transfer,
                      min_tp=args.tensor_parallel_size)


def _holds_all_reduces(measured_path: str) -> bool:
    """Whether a --calibrate file is parallel_step.py's all-reduce samples (else: links and wire formats)."""
    return "samples" in json.loads(Path(measured_path).read_text())


def _calibrate(measured_path: str, calibration_path: Path) -> int:
    measured = json.loads(Path(measured_path).read_text())
    fit = fit_ring_all_reduce(measured["accelerator"], measured["tp"], measured["samples"])
    load_catalog().accelerator(fit.accelerator)  # an unknown accelerator name fails here, naming the known ones
    save_calibration(fit, calibration_path)
    print(f"{fit.accelerator} TP{fit.tp} link: {fit.latency_us:.1f} us per hop, {fit.gb_s:.2f} GB/s "
          f"(ring all-reduce fitted to {fit.num_samples} sizes, max error {fit.max_error:.0%}); kept in "
          f"{calibration_path}")
    return 0


def plan_main(argv: list[str]) -> int:
    args = plan_parser().parse_args(argv)
    try:
        if args.calibrate and _holds_all_reduces(args.calibrate):
            return _calibrate(args.calibrate, Path(args.calibration_file))
        inputs = _inputs(args)
        settings = _from_flags(PlanSettings, args)
        if args.explain:
            data = explanation_to_dict(explain(args.explain, inputs, settings))
            _emit(data, args.json, format_explanation)
            return 0
        result = plan(inputs, _from_flags(SearchSpace, args), settings)
        png = None
        if args.pareto:
            from jido.planner.pareto import plot_pareto
            png = str(plot_pareto(result, args.pareto))
        _emit(plan_to_dict(result, png), args.json, format_plan)
        return 0 if any(r.meets_slo for r in result.ranked) else 1
    except (ValueError, OSError) as exc:
        print(f"jido plan: error: {exc}", file=sys.stderr)
        return 2


def doctor_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jido doctor", description="Name the serving bottleneck from a "
                                "`jido bench` result or a server's Prometheus /metrics.")
    p.add_argument("result", nargs="?", help="bench result JSON (vllm bench serve keys)")
    p.add_argument("--metrics-url", help="a running server's /metrics URL")
    p.add_argument("--metrics-file", help="a saved Prometheus text exposition")
    p.add_argument("--slo", default="", help=f"ttft=MS,tpot=MS (default ttft={DEFAULT_SLO.ttft_ms:g},"
                                             f"tpot={DEFAULT_SLO.tpot_ms:g})")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def doctor_main(argv: list[str]) -> int:
    parser = doctor_parser()
    args = parser.parse_args(argv)
    sources = [s for s in (args.result, args.metrics_url, args.metrics_file) if s]
    if len(sources) != 1:
        parser.error("give exactly one of RESULT.json, --metrics-url, --metrics-file")
    try:
        if args.result:
            obs = observations_from_bench(json.loads(Path(args.result).read_text()))
        elif args.metrics_url:
            obs = observations_from_metrics(fetch_metrics(args.metrics_url))
        else:
            obs = observations_from_metrics(parse_metrics(Path(args.metrics_file).read_text()))
        slo = Slo.parse(args.slo, DEFAULT_SLO)
    except (ValueError, OSError) as exc:
        print(f"jido doctor: error: {exc}", file=sys.stderr)
        return 2
    _emit(findings_to_dict(obs, diagnose(obs, slo), slo), args.json, format_findings)
    return 0


def _emit(data: dict[str, Any], as_json: bool, formatter: Any) -> None:
    print(json.dumps(data, indent=2) if as_json else formatter(data))
