"""`--help` of every `jido` subcommand: each option says what it does, its default and its choices."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from jido.bench.cli import build_parser as bench_parser
from jido.bench.config import DATASETS, BenchConfig
from jido.cli import build_parser
from jido.config import DTYPES, FLAT_CONFIGS
from jido.config.parallel import EXECUTOR_BACKENDS
from jido.config.scheduler import SCHEDULING_MODES
from jido.core.sampling_params import SamplingParams
from jido.planner.cli import doctor_parser, plan_parser
from jido.server.config import ServerConfig
from jido.tools.ablate.cli import build_parser as ablate_parser
from jido.tools.ablate.config import AblateConfig
from jido.tools.perplexity import PerplexityConfig
from jido.tools.roofline import RooflineConfig
from jido.tools.roofline import build_parser as roofline_parser
from jido.utils.cli_args import field_docs


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    main = build_parser()
    sub = next(a for a in main._actions if isinstance(a, argparse._SubParsersAction))
    tasks = next(a for a in sub.choices["eval"]._actions if isinstance(a, argparse._SubParsersAction))
    # bench, roofline, ablate, plan and doctor hand their argv to parsers of their own.
    return {"jido": main, "generate": sub.choices["generate"], "serve": sub.choices["serve"],
            "eval perplexity": tasks.choices["perplexity"], "bench": bench_parser(), "roofline": roofline_parser(),
            "ablate": ablate_parser(), "plan": plan_parser(), "doctor": doctor_parser()}


PARSERS = _subparsers()
GENERATED = {"generate": (*FLAT_CONFIGS, SamplingParams), "serve": (*FLAT_CONFIGS, ServerConfig),
             "eval perplexity": (*FLAT_CONFIGS, PerplexityConfig),
             "bench": (BenchConfig,), "roofline": (RooflineConfig,), "ablate": (AblateConfig, BenchConfig)}


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("name", list(PARSERS))
def test_every_option_of_every_subcommand_has_a_description(name):
    for action in _options(PARSERS[name]):
        assert action.help and action.help.strip(), f"jido {name} {action.option_strings[0]} has no help"


@pytest.mark.parametrize("name", ["jido", "generate", "serve", "eval perplexity", "bench", "roofline", "ablate"])
def test_every_option_of_the_engine_commands_states_its_default(name):
    for action in _options(PARSERS[name]):
        assert "default" in action.help, f"jido {name} {action.option_strings[0]}: {action.help!r}"


@pytest.mark.parametrize("name", list(GENERATED))
def test_every_generated_flag_has_its_fields_docstring_and_default(name):
    groups = {g.title: g for g in PARSERS[name]._action_groups}
    for cls in GENERATED[name]:
        docs = field_docs(cls)
        helps = {a.dest: a.help for a in groups[cls.__name__]._group_actions}
        for f in dataclasses.fields(cls):
            if f.name not in helps:
                continue  # left out of this command (generate's engine seed, bench's hand-made --goodput)
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring or comment"
            assert helps[f.name].startswith(docs[f.name].rstrip(".")), (cls.__name__, f.name)
            if "default" not in docs[f.name].lower():
                assert helps[f.name].endswith(f"(default: {_shown(f.default)})"), helps[f.name]


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else "inf" if value == float("inf") else str(value)


@pytest.mark.parametrize(("name", "flag", "choices"), [
    ("generate", "--dtype", DTYPES), ("serve", "--dtype", DTYPES), ("eval perplexity", "--dtype", DTYPES),
    ("roofline", "--dtype", DTYPES),
    ("serve", "--distributed-executor-backend", EXECUTOR_BACKENDS), ("bench", "--dataset-name", DATASETS),
    ("serve", "--scheduling-mode", SCHEDULING_MODES), ("ablate", "--dataset-name", DATASETS),
    ("jido", "--log-level", ("DEBUG", "INFO", "WARNING", "ERROR"))])
def test_flags_with_a_fixed_set_of_values_list_them_in_help_and_refuse_others(name, flag, choices, capsys):
    parser = PARSERS[name]
    text = parser.format_help()
    assert "{" + ",".join(choices) + "}" in text
    action = next(a for a in _options(parser) if flag in a.option_strings)
    assert tuple(action.choices) == tuple(choices)
    with pytest.raises(SystemExit):
        parser.parse_args([flag, "no-such-value"])
    assert "invalid choice: 'no-such-value'" in capsys.readouterr().err.lower()


def test_help_shows_examples_of_defaults_as_the_dataclasses_set_them():
    serve = PARSERS["serve"].format_help()
    bench = PARSERS["bench"].format_help()
    assert "Tokens per KV block (default: 16)" in " ".join(serve.split())
    assert "(default: 2GiB)" in serve and "(default: auto)" in serve
    assert "Requests per second of a Poisson process; inf sends them all at once (default: inf)" in " ".join(
        bench.split())
