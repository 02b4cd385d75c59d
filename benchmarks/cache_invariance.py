"""Does a request's greedy text depend on what is cached before it? Cold runs against runs with a cached prefix.

For windows of each held-out domain, the engine continues the whole window greedily with an empty prefix cache
(cold), then with the window's first ``--cached-tokens`` tokens already cached by an earlier request (the suffix then
runs as a smaller step, on the routes its row count picks). A difference is reported with the cold run's top-2
log-probability gap at the first differing token, so a flip at a near-tie can be told from an error.

    .venv/bin/python benchmarks/cache_invariance.py --prompts-per-domain 4
"""
from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import sys
from pathlib import Path

from jido import LLM, SamplingParams
from jido.bench.machine import cpu_kind, describe_machine, machine_info, now_iso
from jido.tools import divergence
from jido.tools.perplexity import chat_renderer

RESULTS = Path(__file__).resolve().parent / "results"


def run(args: argparse.Namespace) -> dict:
    llm = LLM(args.model, kv_cache_memory="512MiB")
    config = divergence.DivergenceConfig(prompts_per_domain=args.prompts_per_domain, prompt_tokens=args.prompt_tokens,
                                         max_tokens=args.max_tokens)
    prompts = divergence.domain_prompts(llm, config, chat_renderer(llm))
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=2, ignore_eos=True)
    summaries = {}
    for domain, windows in prompts.items():
        results = []
        for ids in windows:
            llm.reset_prefix_cache()
            cold = llm.generate([ids], greedy, use_tqdm=False)[0]
            llm.reset_prefix_cache()
            llm.generate([ids[:args.cached_tokens]], SamplingParams(max_tokens=1), use_tqdm=False)
            warm = llm.generate([ids], greedy, use_tqdm=False)[0]
            assert warm.num_cached_tokens > 0, "the prefix was not served from the cache"
            results.append(divergence.compare(warm, cold))
        summaries[domain] = divergence.summarize(results, args.max_tokens)
    llm.shutdown()
    return summaries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default=None, help="default: the embedded Gemma 3 270M")
    parser.add_argument("--prompts-per-domain", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=330)
    parser.add_argument("--cached-tokens", type=int, default=256, help="prefix cached before the warm run")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--cpu-kind", default=None, help="the results file's CPU kind, e.g. zen4 (default: this CPU's)")
    parser.add_argument("--lock", type=Path, default=Path("/tmp/jido-bench.lock"))
    args = parser.parse_args(argv)
    with args.lock.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        summaries = run(args)
    model = args.model or "gemma-3-270m"
    lines = [f"Cache invariance: greedy text with a {args.cached_tokens}-token prefix cached vs cold, {args.prompt_tokens}"
             f"-token windows of the held-out texts, {args.max_tokens} tokens, model {model}, default settings. "
             f"{now_iso()}", "", f"Machine: {describe_machine(machine_info())}", "",
             "| domain | identical | first divergence (median) | cold run's top-2 gaps there (nats) |",
             "|---|---:|---:|---|"]
    for domain, s in summaries.items():
        lines.append(f"| {domain} | {s['identical']}/{s['prompts']} | {s['median_first_divergence'] or '-'} | "
                     f"{', '.join(map(str, s['top2_gaps_at_divergence'])) or '-'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    stem = f"cache_invariance-{datetime.date.today().isoformat()}-{args.cpu_kind or cpu_kind()}-{model}"
    (RESULTS / f"{stem}.md").write_text(text, encoding="utf-8")
    (RESULTS / f"{stem}.json").write_text(json.dumps(summaries, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
