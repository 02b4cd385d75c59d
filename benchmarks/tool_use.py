"""How often a served model's tool calls come back well formed: issue 55's target, at least 95% of held-out
requests (one call, two calls, no call needed) answered with `tool_calls` that parse against their tools' schemas
(and none where no call is needed).

For each model, `jido serve --enable-auto-tool-choice --tool-call-parser hermes` at its defaults answers every
case of ``benchmarks/data/tool_use_heldout.json`` (written for jido; nothing was tuned on it) greedily through the
openai client, non-streamed and streamed. An answer's calls **parse** when each names one of the request's tools
with arguments that validate against that tool's `parameters` (jsonschema) and there is one where a call is
needed; it is **well formed** when, besides, there is no call where none is needed; **right** when its call names
are the expected ones (order aside). Streamed answers are assembled from their deltas and compared with the
non-streamed ones (greedy text can differ where a cached prefix or the batch moves a near-tie; see
docs/quantization.md). Run alone, under the lock:

    flock /tmp/jido-bench.lock env PYTHONPATH=. .venv/bin/python benchmarks/tool_use.py \\
        [--models qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct] \\
        [--out benchmarks/results/tool_use-<date>-<cpu kind>.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
from openai import OpenAI

from jido.bench.machine import cpu_kind, machine_info, now_iso

sys.path.insert(0, str(Path(__file__).parent))
from soak import start_server, stop_server  # noqa: E402  (a sibling script)

CASES = Path(__file__).parent / "data" / "tool_use_heldout.json"
CONCURRENCY = 4


def tools_of(names: list[str], catalog: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": name, **catalog[name]}} for name in names]


def ask(client: OpenAI, model: str, case: dict, catalog: dict, stream: bool) -> dict:
    """The answer's calls ([name, arguments text]) and content."""
    request = {"model": model, "messages": [{"role": "user", "content": case["prompt"]}],
               "tools": tools_of(case["tools"], catalog), "temperature": 0, "max_tokens": 256}
    if not stream:
        choice = client.chat.completions.create(**request).choices[0]
        calls = [[c.function.name, c.function.arguments] for c in choice.message.tool_calls or []]
        return {"calls": calls, "content": choice.message.content or "", "finish_reason": choice.finish_reason}
    calls: dict[int, list[str]] = {}
    content, finish = [], None
    for chunk in client.chat.completions.create(**request, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content.append(delta.content or "")
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, ["", ""])
            entry[0] += (call.function.name or "") if call.function else ""
            entry[1] += (call.function.arguments or "") if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return {"calls": [calls[i] for i in sorted(calls)], "content": "".join(content), "finish_reason": finish}


def judge(case: dict, answer: dict, catalog: dict) -> dict:
    """``parses``: every call names a tool of the request with arguments valid against its schema, and there is a
    call where one is needed; ``well_formed``: that, and no call where none is needed; ``right``: the expected
    tools were called."""
    problems = []
    for name, arguments in answer["calls"]:
        if name not in case["tools"]:
            problems.append(f"unknown tool {name!r}")
            continue
        try:
            jsonschema.validate(json.loads(arguments), catalog[name]["parameters"])
        except (ValueError, jsonschema.ValidationError) as exc:
            problems.append(f"{name} arguments: {str(exc).splitlines()[0]}")
    if case["expect"] and not answer["calls"]:
        problems.append("no call")
    parses = not problems
    if answer["calls"] and not case["expect"]:
        problems.append("a call where none was needed")
    names = sorted(name for name, _ in answer["calls"])
    return {"parses": parses, "well_formed": not problems, "right": not problems and names == sorted(case["expect"]),
            "problems": problems}


def evaluate(model: str, data: dict) -> dict:
    process, base_url = start_server(["--model", model, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    try:
        client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=600)
        catalog = data["tools"]
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            plain = list(pool.map(lambda c: ask(client, model, c, catalog, False), data["cases"]))
            streamed = list(pool.map(lambda c: ask(client, model, c, catalog, True), data["cases"]))
    finally:
        stop_server(process)
    rows = []
    for case, answer, stream in zip(data["cases"], plain, streamed):
        rows.append({**case, "answer": answer, **judge(case, answer, catalog),
                     "stream_same": stream["calls"] == answer["calls"] and stream["content"] == answer["content"]})
    return {"model": model, "cases": rows, "summary": summarize(rows)}


def summarize(rows: list[dict]) -> dict:
    summary = {}
    for kind in ["single", "two", "none", "all"]:
        chosen = [r for r in rows if kind in ("all", r["kind"])]
        summary[kind] = {"n": len(chosen), "parses": sum(r["parses"] for r in chosen),
                         "well_formed": sum(r["well_formed"] for r in chosen),
                         "right": sum(r["right"] for r in chosen), "stream_same": sum(r["stream_same"] for r in chosen)}
    return summary


def write_markdown(path: Path, result: dict) -> None:
    machine = result["machine"]
    lines = [f"# tool_use, {result['date']}, {cpu_kind(machine)}", "",
             f"CPU: {machine.get('cpu_model')} x{machine.get('num_cpus')}, ISA {machine.get('isa')}; "
             f"torch {machine.get('torch')}; jido {result['commit']}. Held-out cases: "
             f"`benchmarks/data/tool_use_heldout.json`; greedy; `--tool-call-parser hermes`, default flags.", "",
             "| model | kind | cases | calls parse | well formed | right calls | streamed = non-streamed |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for run in result["runs"]:
        for kind, s in run["summary"].items():
            share = {key: f"{s[key]} ({100 * s[key] / s['n']:.0f}%)" for key in ("parses", "well_formed", "right")}
            lines.append(f"| {run['model']} | {kind} | {s['n']} | {share['parses']} | {share['well_formed']} | "
                         f"{share['right']} | {s['stream_same']} |")
    lines += ["", "Answers that were not well formed:", ""]
    for run in result["runs"]:
        for row in run["cases"]:
            if not row["well_formed"]:
                lines.append(f"- {run['model']}, {row['kind']}: {row['prompt']!r}: {'; '.join(row['problems'])} "
                             f"(content {row['answer']['content'][:80]!r})")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"])
    parser.add_argument("--commit", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    data = json.loads(CASES.read_text(encoding="utf-8"))
    runs = []
    for model in args.models:
        runs.append(evaluate(model, data))
        print(model, json.dumps(runs[-1]["summary"]), flush=True)
    if args.out:
        result = {"date": now_iso(), "machine": machine_info(), "commit": args.commit, "runs": runs}
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        write_markdown(args.out.with_suffix(".md"), result)


if __name__ == "__main__":
    main()
