"""Perplexity and tokens/s per engine setting, on the pydoc topics text, as a markdown table with ratios to the first.

Each ``--variant`` is a list of engine settings (``key=value``, comma-separated, the keywords of ``LLM(...)``)
run as ``jido eval perplexity --json`` in a process of its own, one at a time under the bench lock, so a
variant that fails (a setting this jido does not have yet, a crash) is reported in its row and the others
still run. Ratios divide each variant's figure by the first variant's.

    .venv/bin/python benchmarks/perplexity.py --variant dtype=float32 --variant dtype=bfloat16 \\
        --variant quantization=int8 --max-chunks 20 --out benchmarks/results/perplexity-<date>-<cpu kind>.md
"""
from __future__ import annotations

import argparse
import fcntl
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jido.utils.reference_text import reference_text
from jido.bench.machine import describe_machine, machine_info, now_iso
from jido.config import engine_keywords

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    """One variant: its settings, and the `--json` record or why there is none."""

    name: str
    settings: dict[str, str]
    record: dict[str, Any] | None = None
    error: str | None = None


def parse_variant(text: str) -> dict[str, str]:
    """``"dtype=bfloat16,attention_backend=torch"`` -> ``{"dtype": "bfloat16", "attention_backend": "torch"}``."""
    settings = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"variant {text!r}: {item!r} is not key=value")
        settings[key.strip()] = value.strip()
    return settings


def unknown_settings(settings: dict[str, str]) -> str | None:
    """Why this jido cannot run the variant (settings no engine config has), or None."""
    unknown = sorted(set(settings) - set(engine_keywords()))
    if not unknown:
        return None
    return f"no engine setting {', '.join(unknown)} in this jido (it has: {', '.join(engine_keywords())})"


def engine_flags(settings: dict[str, str]) -> list[str]:
    """The settings as `jido` flags: ``--key value``, and ``--key`` / ``--no-key`` for true / false."""
    flags = []
    for key, value in settings.items():
        flag = key.replace("_", "-")
        if value.lower() in ("true", "false"):
            flags.append(f"--{flag}" if value.lower() == "true" else f"--no-{flag}")
        else:
            flags += [f"--{flag}", value]
    return flags


def eval_perplexity(settings: dict[str, str], eval_flags: list[str], lock_file: Path, label: str = "",
                    positional: tuple[str, ...] = ()) -> tuple[dict[str, Any] | None, str | None]:
    """`jido eval perplexity --json` with ``settings`` as engine flags, one run at a time on this machine (under
    ``lock_file``): (its record, None), or (None, the settings' error or the last line the command wrote to
    stderr)."""
    error = unknown_settings(settings)
    if error:
        return None, error
    command = [sys.executable, "-m", "jido.cli", "--log-level", "warning", "eval", "perplexity", "--json",
               *eval_flags, *engine_flags(settings), *positional]
    print(f"{label}{': ' if label else ''}{' '.join(command[2:])}", file=sys.stderr, flush=True)
    with lock_file.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one measurement at a time on this machine
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return json.loads(done.stdout), None


def run_variant(run: Run, text_file: Path, eval_flags: list[str], lock_file: Path) -> None:
    """Fill in ``run.record``, or ``run.error`` with the last line the command wrote to stderr."""
    run.record, run.error = eval_perplexity(run.settings, eval_flags, lock_file, run.name, (str(text_file),))


def markdown_table(runs: list[Run]) -> str:
    """A row per variant: perplexity ± its standard error, tokens/s, and both as ratios to the first variant."""
    base = runs[0].record if runs else None
    lines = ["| variant | perplexity | ± | ratio | tokens/s | ratio | dtype | scored tokens |",
             "|---|---:|---:|---:|---:|---:|---|---:|"]
    for run in runs:
        record = run.record
        if record is None:
            error = (run.error or "").replace("|", "\\|")  # a bar would end the cell
            lines.append(f"| {run.name} | failed: {error} | | | | | | |")
            continue
        ppl_ratio = f"{record['perplexity'] / base['perplexity']:.4f}" if base else "-"
        speed_ratio = f"{record['tokens_per_s'] / base['tokens_per_s']:.2f}" if base else "-"
        stderr = "-" if record["stderr"] is None else f"{record['stderr']:.4f}"
        lines.append(f"| {run.name} | {record['perplexity']:.4f} | {stderr} | {ppl_ratio} | "
                     f"{record['tokens_per_s']:.1f} | {speed_ratio} | {record['dtype']} | "
                     f"{record['num_scored_tokens']} |")
    return "\n".join(lines)


def report(runs: list[Run], args: argparse.Namespace, text_file: Path) -> str:
    return "\n".join([
        f"Perplexity on the pydoc topics text ({text_file}), --context-length {args.context_length}, "
        f"--max-chunks {args.max_chunks}, model {args.model or 'default (Gemma 3 270M)'}; {now_iso()}",
        f"Machine: {describe_machine(machine_info())}", "", markdown_table(runs), ""])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--variant", action="append", required=True, metavar="KEY=VALUE[,KEY=VALUE]",
                        help="engine settings of one run; give it once per run (the first is the baseline)")
    parser.add_argument("--model", default=None, help="model of every run (default: the embedded Gemma 3 270M)")
    parser.add_argument("--context-length", type=int, default=512, help="tokens per chunk (default: 512)")
    parser.add_argument("--max-chunks", type=int, default=20, help="chunks scored per run (default: 20)")
    parser.add_argument("--text", type=Path, default=Path("/tmp/jido-pydoc-topics.txt"),
                        help="where the pydoc text is written (default: /tmp/jido-pydoc-topics.txt)")
    parser.add_argument("--lock", type=Path, default=Path("/tmp/jido-bench.lock"),
                        help="file locked around each run (default: /tmp/jido-bench.lock)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown here (default: none)")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="write every run's record here (default: none)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runs = [Run(v, parse_variant(v)) for v in args.variant]
    args.text.write_text(reference_text(), encoding="utf-8")
    eval_flags = ["--context-length", str(args.context_length), "--max-chunks", str(args.max_chunks)]
    eval_flags += ["--model", args.model] if args.model else []
    for run in runs:
        run_variant(run, args.text, eval_flags, args.lock)
    text = report(runs, args, args.text)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    if args.json_out:
        records = [{"variant": r.name, "record": r.record, "error": r.error} for r in runs]
        args.json_out.write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")
    return 0 if all(r.record is not None for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
