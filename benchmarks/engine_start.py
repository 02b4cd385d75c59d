"""How long an engine takes to start, and how long a second engine of the same model takes in the same process,
for two checkouts of jido measured in one run (the baseline and the change).

Each repeat is a fresh Python process per checkout (``PYTHONPATH=<checkout>``), the checkouts alternating so
drift hits both alike; the page cache is warm (the model's files were read before), as on any start but a
machine's first. A process imports jido, builds ``LLM(model, quantization, dtype)`` with a small KV cache, then a
second one while the first lives, and reports both times and its peak RSS. Figures are medians over repeats.
Run alone, under the lock:

    flock /tmp/jido-bench.lock .venv/bin/python benchmarks/engine_start.py --checkouts /tmp/base . \\
        [--models gemma-3-270m qwen2.5-coder-1.5b-instruct] [--quantizations none default] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from jido.bench.machine import cpu_kind, machine_info, now_iso

RESULTS = Path(__file__).parent / "results"

CHILD = r"""
import json, resource, sys, time
start = time.perf_counter()
from jido import LLM
imported = time.perf_counter() - start
model, quantization, dtype = sys.argv[1:4]
kwargs = {} if quantization == "default" else {"quantization": quantization}
times, engines = [], []
for _ in range(2):  # the second while the first still lives, as in a notebook or a test session
    start = time.perf_counter()
    engines.append(LLM(model=model, dtype=dtype, kv_cache_memory="64MiB", **kwargs))
    times.append(time.perf_counter() - start)
for llm in engines:
    llm.shutdown()
import jido
print(json.dumps({"jido": jido.__file__, "import_s": imported, "first_s": times[0], "second_s": times[1],
                  "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def start_once(checkout: Path, model: str, quantization: str, dtype: str) -> dict:
    # Run from the checkout: `python -c` puts the working directory ahead of PYTHONPATH on sys.path.
    root = checkout.resolve()
    done = subprocess.run([sys.executable, "-c", CHILD, model, quantization, dtype], cwd=root, check=True,
                          env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["jido"].startswith(str(root)):
        raise RuntimeError(f"{checkout}: the child imported jido from {result['jido']}")
    return result


def git_head(checkout: Path) -> str:
    return subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkouts", nargs=2, type=Path, required=True, help="baseline, then change")
    parser.add_argument("--models", nargs="+", default=["gemma-3-270m", "qwen2.5-coder-1.5b-instruct"])
    parser.add_argument("--quantizations", nargs="+", default=["none", "default"])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    heads = [git_head(c) for c in args.checkouts]
    rows = []
    for model in args.models:
        for quantization in args.quantizations:
            runs: dict[str, list[dict]] = {head: [] for head in heads}
            for _ in range(args.repeats):
                for checkout, head in zip(args.checkouts, heads):
                    runs[head].append(start_once(checkout, model, quantization, args.dtype))
            row = {"model": model, "quantization": quantization, "dtype": args.dtype}
            for role, head in zip(("baseline", "change"), heads):
                row[role] = {key: statistics.median(r[key] for r in runs[head]) for key in runs[head][0]
                             if key != "jido"}
                row[role]["runs"] = runs[head]
            row["ratios"] = {key: row["change"][key] / row["baseline"][key]
                             for key in ("first_s", "second_s", "peak_rss_gib")}
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("model", "quantization", "ratios")}), flush=True)
    result = {"date": now_iso(), "machine": machine_info(), "baseline": heads[0], "change": heads[1],
              "repeats": args.repeats, "rows": rows}
    out = args.out or RESULTS / f"engine_start-{now_iso()[:10]}-{cpu_kind()}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(report(result))
    print(out)


def report(result: dict) -> str:
    machine = result["machine"]
    lines = [f"# engine_start, {result['date']}, {cpu_kind()}", "",
             f"CPU: {machine['cpu_model']} x{machine['num_cpus']}, ISA {machine['isa']}, flags "
             f"{' '.join(machine['cpu_flags'])}; torch {machine['torch']}; Python {machine['python']}.", "",
             f"Baseline {result['baseline']}, change {result['change']}; medians of {result['repeats']} fresh "
             "processes each, alternating; page cache warm; `benchmarks/engine_start.py`.", "",
             "| model | quantization | first LLM (s) base → change | second LLM in the process (s) | peak RSS (GiB) |",
             "|---|---|---|---|---|"]
    for row in result["rows"]:
        b, c, r = row["baseline"], row["change"], row["ratios"]
        lines.append(f"| {row['model']} | {row['quantization']} | {b['first_s']:.2f} → {c['first_s']:.2f} "
                     f"({r['first_s']:.2f}x) | {b['second_s']:.2f} → {c['second_s']:.2f} ({r['second_s']:.2f}x) | "
                     f"{b['peak_rss_gib']:.2f} → {c['peak_rss_gib']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
