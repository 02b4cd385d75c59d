"""--preemption-mode recompute against swap on the default model: requests that outgrow a small pool and preempt each other.

``--num-requests`` prompts of ``--prompt-len`` tokens of pydoc text each generate ``--output-len`` tokens at once
in a pool that holds about half of them at full length, so the newest are preempted and resumed over and over.
Per mode: wall time, output tok/s, preemptions, blocks loaded back (swap), greedy agreement with recompute;
modes interleaved per repeat, medians, ratios to recompute of the same repeat.

    flock /tmp/jido-bench.lock .venv/bin/python benchmarks/preemption.py \\
        --out benchmarks/results/preemption-<date>-<cpu kind>.md
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from jido import LLM, SamplingParams
from jido.bench.machine import describe_machine, machine_info, now_iso
from jido.utils.reference_text import reference_text


def _run(mode: str, args: argparse.Namespace) -> dict:
    llm = LLM(kv_cache_memory=args.kv_cache_memory, preemption_mode=mode, max_num_seqs=args.num_requests)
    ids = llm.get_tokenizer().encode(reference_text())
    prompts = [ids[i * 5000: i * 5000 + args.prompt_len] for i in range(args.num_requests)]
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate([ids[-64:]], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    stats = llm.llm_engine.get_scheduler_stats()
    loaded = sum(t.loaded_blocks for t in stats.kv_connector)
    llm.shutdown()
    return {"wall_s": wall, "tok_s": args.num_requests * args.output_len / wall, "preemptions": stats.num_preemptions,
            "loaded_blocks": loaded, "tokens": [o.outputs[0].token_ids for o in outputs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--kv-cache-memory", default="96MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"recompute": [], "swap": []}
    for repeat in range(args.repeats):
        for mode in runs:
            runs[mode].append(_run(mode, args))
            print(f"repeat {repeat} {mode}: {runs[mode][-1]['wall_s']:.1f} s, "
                  f"{runs[mode][-1]['preemptions']} preemptions", flush=True)
    lines = [f"# Preemption modes ({now_iso()[:10]})", "", describe_machine(machine_info()), "",
             f"Default model, {args.num_requests} requests x ({args.prompt_len} prompt + {args.output_len} output) "
             f"tokens at once, `kv_cache_memory={args.kv_cache_memory}`; medians of {args.repeats} repeats, modes "
             "interleaved; ratio: wall time / recompute's in the same repeat.", "",
             "| mode | wall s | / recompute | output tok/s | preemptions | blocks loaded back | greedy agreement |",
             "|---|---|---|---|---|---|---|"]
    for mode, reps in runs.items():
        ratio = statistics.median(r["wall_s"] / b["wall_s"] for r, b in zip(reps, runs["recompute"]))
        same = statistics.mean(sum(a == b for x, y in zip(r["tokens"], b["tokens"]) for a, b in zip(x, y))
                               / sum(len(y) for y in b["tokens"]) for r, b in zip(reps, runs["recompute"]))
        lines.append(f"| {mode} | {statistics.median(r['wall_s'] for r in reps):.1f} | {ratio:.3f} | "
                     f"{statistics.median(r['tok_s'] for r in reps):.1f} | "
                     f"{statistics.median(r['preemptions'] for r in reps):.0f} | "
                     f"{statistics.median(r['loaded_blocks'] for r in reps):.0f} | {same:.3f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out is not None:
        args.out.write_text(report, encoding="utf-8")


if __name__ == "__main__":
    main()
