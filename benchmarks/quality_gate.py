"""The quality gate: perplexity per held-out domain for each engine setting, against float32 GGUF-native.

Every variant runs `jido eval perplexity --domains all --json` in a process of its own, one at a time under the
bench lock. The first row is the reference (``dtype=float32,quantization=gguf``: the file's own codes in float32);
every other row is reported per domain as its excess over it. The ``default`` variant (no settings: whatever this
CPU resolves) must stay within ``--gate`` percent on every domain; the others are opt-in schemes, reported.

    .venv/bin/python benchmarks/quality_gate.py --model qwen2.5-coder-0.5b-instruct \\
        --variant default= --variant gguf-bf16=dtype=bfloat16 --variant w8a8=dtype=bfloat16,quantization=gguf_w8a8
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from perplexity import eval_perplexity, parse_variant

from jido.bench.machine import cpu_kind, describe_machine, machine_info, now_iso
from jido.utils.text_domains import DOMAINS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
REFERENCE = ("reference", {"dtype": "float32", "quantization": "gguf"})
DEFAULT_GATE_PERCENT = 1.0


def run_variant(settings: dict[str, str], eval_flags: list[str], lock_file: Path) -> dict[str, Any]:
    """The `--json` record of one variant over every domain, or ``{"error": last stderr line}``."""
    record, error = eval_perplexity(settings, ["--domains", "all", *eval_flags], lock_file)
    return {"error": error} if record is None else record


def excess_percent(record: dict[str, Any], reference: dict[str, Any]) -> dict[str, float]:
    """Each domain's perplexity over the reference's, in percent."""
    return {d: 100 * (record["domains"][d]["perplexity"] / reference["domains"][d]["perplexity"] - 1)
            for d in DOMAINS}


def table(runs: dict[str, dict[str, Any]], gate: float) -> str:
    """A row per variant: its resolved dtype / quantization, perplexity (reference) or excess % per domain."""
    reference = runs[REFERENCE[0]]
    head = "| variant | dtype | quantization | " + " | ".join(DOMAINS) + " | worst | gate |"
    lines = [head, "|---|---|---|" + "---:|" * (len(DOMAINS) + 1) + "---|"]
    for name, record in runs.items():
        if "error" in record:
            lines.append(f"| {name} | failed: {record['error'].replace('|', '/')} |" + " |" * (len(DOMAINS) + 3))
            continue
        quantization = record["engine"].get("quantization") or "(default)"
        if name == REFERENCE[0]:
            cells = [f"{record['domains'][d]['perplexity']:.3f}" for d in DOMAINS]
            lines.append(f"| {name} | {record['dtype']} | {quantization} | " + " | ".join(cells) + " | | |")
            continue
        excess = excess_percent(record, reference)
        worst = max(excess.values())
        verdict = ("pass" if worst <= gate else "FAIL") if name == "default" else "opt-in"
        cells = [f"{excess[d]:+.2f}%" for d in DOMAINS]
        lines.append(f"| {name} | {record['dtype']} | {quantization} | " + " | ".join(cells) +
                     f" | {worst:+.2f}% | {verdict} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                        help="a named row of engine settings, e.g. gguf-bf16=dtype=bfloat16; `default=` is the "
                             "machine's defaults (the reference row is always run first)")
    parser.add_argument("--model", default=None, help="model of every run (default: the embedded Gemma 3 270M)")
    parser.add_argument("--context-length", type=int, default=512, help="tokens per chunk (default: 512)")
    parser.add_argument("--max-chunks", type=int, default=3, help="chunks scored per domain (default: 3)")
    parser.add_argument("--gate", type=float, default=DEFAULT_GATE_PERCENT,
                        help=f"the default's largest excess per domain, in percent (default: {DEFAULT_GATE_PERCENT})")
    parser.add_argument("--lock", type=Path, default=Path("/tmp/jido-bench.lock"),
                        help="file locked around each run (default: /tmp/jido-bench.lock)")
    parser.add_argument("--cpu-kind", default=None, help="the results file's CPU kind, e.g. zen4 (default: this CPU's)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    variants = [REFERENCE] + [(v.split("=", 1)[0], parse_variant(v.split("=", 1)[1])) for v in args.variant]
    eval_flags = ["--context-length", str(args.context_length), "--max-chunks", str(args.max_chunks)]
    eval_flags += ["--model", args.model] if args.model else []
    runs = {name: run_variant(settings, eval_flags, args.lock) for name, settings in variants}
    model = args.model or "gemma-3-270m"
    header = (f"Quality gate: perplexity on jido's held-out texts (jido/utils/corpora/heldout), model {model}, "
              f"{args.max_chunks} chunks of {args.context_length} tokens a domain; reference: float32 GGUF-native; "
              f"gate {args.gate}% for the default. {now_iso()}\n\nMachine: {describe_machine(machine_info())}\n")
    text = header + "\n" + table(runs, args.gate) + "\n"
    print(text)
    kind = args.cpu_kind or cpu_kind()
    stem = f"quality_gate-{datetime.date.today().isoformat()}-{kind}-{model}"
    (RESULTS / f"{stem}.md").write_text(text, encoding="utf-8")
    (RESULTS / f"{stem}.json").write_text(json.dumps({"variants": dict(variants), "runs": runs}, indent=1) + "\n",
                                          encoding="utf-8")
    failed = "default" in runs and "error" not in runs["default"] and "error" not in runs[REFERENCE[0]] and \
        max(excess_percent(runs["default"], runs[REFERENCE[0]]).values()) > args.gate
    return 1 if failed or any("error" in r for r in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
