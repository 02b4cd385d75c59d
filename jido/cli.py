"""The ``jido`` command: generate, serve, eval, models, bench, router, roofline, ablate, plan and doctor."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from jido.config import FLAT_CONFIGS, JSON_CONFIGS, EngineConfig
from jido.core.sampling_params import SamplingParams
from jido.metrics.stats import IterationStats
from jido.tools.perplexity import (PerplexityConfig, domains_record, evaluate, evaluate_domains, format_result,
                                   read_text, result_record)
from jido.tools.divergence import DivergenceConfig
from jido.utils.text_domains import DOMAINS
from jido.utils.cli_args import add_dataclass_arguments, dataclass_kwargs, summary

if TYPE_CHECKING:  # the engine loads torch: only `jido generate`, `serve` and `eval` import it, when they run
    from jido.engine.llm_engine import LLMEngine
    from jido.engine.outputs import RequestOutput


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _generate_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("generate", help="generate a continuation of a prompt with the local model")
    parser.add_argument("prompt", nargs="+", help="one or more prompts, generated for as one batch")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per prompt, with its timing (default: off, plain text)")
    # --seed is the request's sampling seed here; the engine's own seed keeps its default.
    _add_engine_arguments(parser, skip=("seed",))
    add_dataclass_arguments(parser, SamplingParams, skip=("n",))
    parser.set_defaults(handler=_run_generate)


def _run_generate(args: argparse.Namespace) -> int:
    from jido.engine.llm import LLM

    params = SamplingParams(**dataclass_kwargs(args, SamplingParams))
    llm = LLM(**_engine_kwargs(args, skip=("seed",)))
    if not args.json:
        for output in llm.generate(args.prompt, params):
            print(output.prompt + output.outputs[0].text)
        return 0
    for output, timing in _generate_timed(llm.llm_engine, args.prompt, params):
        completion = output.outputs[0]
        print(json.dumps({"prompt": output.prompt, "prompt_token_ids": output.prompt_token_ids,
                          "text": completion.text, "token_ids": completion.token_ids,
                          "finish_reason": completion.finish_reason,
                          "num_cached_tokens": output.num_cached_tokens, "timing": timing}, ensure_ascii=False))
    return 0


def _generate_timed(engine: LLMEngine, prompts: list[str],
                    params: SamplingParams) -> list[tuple[RequestOutput, dict[str, Any]]]:
    """Generate for the prompts as one batch, stepping the engine here to time each request and step.

    Per request: TTFT and end-to-end time from the moment the batch is queued, and decode tokens/s after
    the first token. For the whole run: where the steps' time went (schedule, model forward, sampling,
    and the rest: executor hand-off, scheduler update, detokenizing), from the engine's iteration stats.
    """
    ids = [f"generate-{i}" for i in range(len(prompts))]
    processed = [engine.prepare_prompt(prompt) for prompt in prompts]  # every prompt checked before any runs
    start = time.perf_counter()
    for request_id, prompt in zip(ids, processed):
        engine.add_request(request_id, prompt, params)
    merged: dict[str, RequestOutput] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    steps = dict.fromkeys(("total_s", "schedule_s", "model_s", "sample_s", "other_s"), 0.0)
    num_steps = 0
    while engine.has_unfinished_requests():
        step_start = time.perf_counter()
        deltas = engine.step()
        now = time.perf_counter()
        num_steps += 1
        _add_step(steps, now - step_start, engine.last_iteration_stats)
        for delta in deltas:
            output = merged.setdefault(delta.request_id, delta)
            if output is not delta:
                output.add(delta)
            if delta.outputs[0].token_ids:
                first.setdefault(delta.request_id, now)
                last[delta.request_id] = now
    run = {"num_steps": num_steps, **steps}
    return [(merged[r], _request_timing(merged[r], start, first.get(r), last.get(r), run)) for r in ids]


def _add_step(steps: dict[str, float], wall_s: float, stats: IterationStats | None) -> None:
    inside = (stats.schedule_s, stats.model_s, stats.sample_s) if stats is not None else (0.0, 0.0, 0.0)
    steps["total_s"] += wall_s
    for key, seconds in zip(("schedule_s", "model_s", "sample_s"), inside):
        steps[key] += seconds
    steps["other_s"] += wall_s - sum(inside)


def _request_timing(output: RequestOutput, start: float, first: float | None, last: float | None,
                    run: dict[str, Any]) -> dict[str, Any]:
    num_tokens = len(output.outputs[0].token_ids)
    decode_s = last - first if first is not None and last is not None else 0.0
    return {"ttft_s": None if first is None else first - start, "e2e_s": None if last is None else last - start,
            "num_output_tokens": num_tokens,
            "decode_tok_s": (num_tokens - 1) / decode_s if num_tokens > 1 and decode_s > 0 else None,
            "steps": run}


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    from jido.server.config import ServerConfig

    parser = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    _add_engine_arguments(parser)
    add_dataclass_arguments(parser, ServerConfig)
    parser.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    from jido.server.config import ServerConfig
    from jido.server.launcher import KernelsMissingError, serve

    server_config = ServerConfig(**dataclass_kwargs(args, ServerConfig))
    try:
        return serve(EngineConfig.from_kwargs(**_engine_kwargs(args)), server_config)
    except KernelsMissingError as exc:
        logging.getLogger("jido").error("%s", exc)
        return 1


def _eval_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("eval", help="measure the model's quality on a text")
    tasks = parser.add_subparsers(dest="task", required=True)
    perplexity = tasks.add_parser(
        "perplexity", help="a text file's perplexity, as llama.cpp's llama-perplexity computes it",
        description="Perplexity of FILE by llama-perplexity's method: consecutive chunks of --context-length "
                    "tokens, each starting with BOS, the tokens after each chunk's first half scored; prints it "
                    "with its standard error, the tokens scored and tokens/s")
    perplexity.add_argument("file", metavar="FILE", nargs="?",
                            help="a UTF-8 text file, tokenized as one text (or --domains for jido's own texts)")
    add_dataclass_arguments(perplexity, PerplexityConfig)
    _add_engine_arguments(perplexity)
    perplexity.set_defaults(handler=_run_perplexity)
    divergence = tasks.add_parser(
        "divergence", help="greedy continuations against float32 GGUF-native ones, per held-out domain",
        description="Continue windows of each held-out domain greedily under the given settings and under the "
                    "float32 reference (the file's own codes, or float weights, in float32); print where the "
                    "continuations first differ and the reference's top-2 log-probability gap there")
    add_dataclass_arguments(divergence, DivergenceConfig)
    _add_engine_arguments(divergence)
    divergence.set_defaults(handler=_run_divergence)


def _run_perplexity(args: argparse.Namespace) -> int:
    from jido.engine.llm import LLM

    config = PerplexityConfig(**dataclass_kwargs(args, PerplexityConfig))
    if (args.file is None) == (config.domains is None):
        raise ValueError("give either FILE or --domains (all, or some of: " + ", ".join(DOMAINS) + "), not both")
    text = None if args.file is None else read_text(args.file)  # a bad file fails before the model loads
    llm = LLM(**_engine_kwargs(args))
    if text is not None:
        result = evaluate(llm, text, config)
        print(json.dumps(result_record(result, llm)) if config.json else format_result(result))
        return 0
    results = evaluate_domains(llm, config)
    if config.json:
        print(json.dumps(domains_record(results, llm, config.split)))
    for domain, result in ([] if config.json else results.items()):
        print(f"{domain:<15} {format_result(result)}")
    return 0


def _run_divergence(args: argparse.Namespace) -> int:
    from jido.tools import divergence

    config = DivergenceConfig(**dataclass_kwargs(args, DivergenceConfig))
    summaries = divergence.run(_engine_kwargs(args), config)
    if config.json:
        print(json.dumps(summaries))
    for domain, domain_summary in ([] if config.json else summaries.items()):
        print(divergence.format_summary(domain, domain_summary))
    return 0


def _models_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("models", help="list the named models: installed or not, assembled, and their size")
    parser.set_defaults(handler=_run_models)


def _run_models(args: argparse.Namespace) -> int:
    from jido.models.named import DEFAULT_MODEL, NAMED_MODELS, cache_root, gguf_path, is_installed, is_verified

    root = cache_root()
    print(f"{'NAME':<30} {'SIZE':>8}  {'STATE':<10} {'INSTALL WITH':<30} DESCRIPTION")
    for model in NAMED_MODELS.values():
        state = "assembled" if is_verified(model, root) else "installed" if is_installed(model) else "missing"
        name = model.name + (" (default)" if model.name == DEFAULT_MODEL else "")
        print(f"{name:<30} {model.size / 2**20:>5.0f} MiB  {state:<10} {model.install_hint:<30} {model.description}")
    print(f"\nassembled files live in {gguf_path(next(iter(NAMED_MODELS.values())), root).parent}; an installed "
          "model is assembled and verified (size and sha256) the first time it is served")
    return 0


def _add_engine_arguments(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One flag per engine setting (vLLM's names), generated from the configs by concern."""
    for config_cls in FLAT_CONFIGS:
        add_dataclass_arguments(parser, config_cls, skip=skip)
    for name, config_cls in JSON_CONFIGS.items():
        keys = ", ".join(f.name for f in dataclasses.fields(config_cls))
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None, metavar="JSON",
                            help=f"{summary(config_cls)} A JSON object with keys {keys} (default: none)")


def _engine_kwargs(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict:
    kwargs = {}
    for config_cls in FLAT_CONFIGS:
        kwargs.update(dataclass_kwargs(args, config_cls, skip=skip))
    kwargs.update({name: getattr(args, name) for name in JSON_CONFIGS if getattr(args, name) is not None})
    return kwargs


# Subcommands with parsers of their own: "module:function" taking the remaining argv, imported lazily so
# that `jido plan`, `jido bench` and `jido ablate` never load torch.
_DELEGATES = {
    "plan": ("jido.planner.cli:plan_main", "plan a heterogeneous prefill/decode deployment"),
    "doctor": ("jido.planner.cli:doctor_main", "name the bottleneck from a bench result or /metrics"),
    "bench": ("jido.bench.cli:bench_main", "load-test any OpenAI-compatible server"),
    "router": ("jido.router.cli:router_main", "route requests over prefill/decode or data-parallel instances"),
    "train-draft": ("jido.tools.train_draft:train_draft_main", "train an EAGLE draft on the target's own "
                                                                "continuations, on CPU"),
    "roofline": ("jido.tools.roofline:roofline_main", "this machine's limits for the model, next to jido's figures"),
    "ablate": ("jido.tools.ablate.cli:ablate_main", "which serving techniques pay on a workload, each on its own "
                                                     "server"),
    "build-kernels": ("jido.tools.build_kernels:build_kernels_main", "compile every C++ kernel for this CPU now and "
                                                                     "report any that failed"),
}


def _delegate_parser(sub: argparse._SubParsersAction, name: str) -> None:
    target, help_text = _DELEGATES[name]
    parser = sub.add_parser(name, help=help_text, add_help=False)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(handler=lambda args: _run_delegate(target, args.rest))


def _run_delegate(target: str, argv: list[str]) -> int:
    module_name, function = target.split(":")
    return getattr(importlib.import_module(module_name), function)(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jido", description="jido: an LLM inference serving engine")
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS,
                        help="what the log on stderr shows (default: INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
    _serve_parser(sub)
    _eval_parser(sub)
    _models_parser(sub)
    for name in _DELEGATES:
        _delegate_parser(sub, name)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _DELEGATES:
        # argparse's REMAINDER cannot hand over a leading "--flag", so delegates get their argv directly.
        args = argparse.Namespace(log_level="INFO", handler=lambda a: _run_delegate(_DELEGATES[argv[0]][0], argv[1:]))
    else:
        args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        return args.handler(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"jido: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
