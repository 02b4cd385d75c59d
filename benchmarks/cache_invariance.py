"""Does a request's output depend on what is cached or batched beside it, with batch_invariant off and on? At what cost?

For windows of each held-out domain, the engine continues the whole window greedily with an empty prefix cache
(cold), then with the window's first ``--cached-tokens`` tokens already cached by an earlier request (the suffix then
runs as a smaller step, on the routes its row count picks: 74 rows after 256, 10 after 320, a decode-sized query),
then with all of the domain's windows in one batch. A
text difference is reported with the cold run's top-2 log-probability gap at the first differing token, so a flip at
a near-tie can be told from an error; "bits" counts the runs whose every logprob (the top 2 at each position) equals
the cold run's bit for bit, and the largest logprob difference before any token differs is given.

The cost: ``--repeats`` rounds, the modes alternating within each (after an untimed one), medians and ranges of a
``--long-tokens`` prompt's prefill, batch-1 decode (tokens 2-129 of a 100-token prompt) and 16 prompts of 256 tokens
continued by 64 each, in one process.

    .venv/bin/python benchmarks/cache_invariance.py --prompts-per-domain 4
"""
from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import statistics
import sys
import time
from pathlib import Path

from jido import LLM, SamplingParams
from jido.bench.machine import cpu_kind, describe_machine, machine_info, now_iso
from jido.engine.outputs import RequestOutput
from jido.tools import divergence
from jido.tools.perplexity import chat_renderer
from jido.utils.reference_text import reference_text

RESULTS = Path(__file__).resolve().parent / "results"
MODES = {"off": False, "on": True}


def same_bits(a: RequestOutput, b: RequestOutput) -> bool:
    return a.outputs[0].token_ids == b.outputs[0].token_ids and a.outputs[0].logprobs == b.outputs[0].logprobs


def logprob_delta(a: RequestOutput, b: RequestOutput) -> float:
    """The largest difference of a token's logprob between the two runs, up to where their tokens first differ."""
    delta = 0.0
    for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
        ours, theirs = dict(zip(x.top_token_ids, x.top_logprobs)), dict(zip(y.top_token_ids, y.top_logprobs))
        delta = max([delta, *(abs(ours[t] - theirs[t]) for t in ours.keys() & theirs.keys())])
        if x.sampled_token_id != y.sampled_token_id:
            break
    return delta


def invariance(llm: LLM, prompts: dict[str, list[list[int]]], args: argparse.Namespace) -> dict:
    """Per domain: identical text and identical bits against the cold runs, after each cached prefix and batched."""
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=2, ignore_eos=True)
    summaries = {}
    for domain, windows in prompts.items():
        cold = []
        for ids in windows:
            llm.reset_prefix_cache()
            cold.append(llm.generate([ids], greedy, use_tqdm=False)[0])
        compared = {}
        for cached_tokens in args.cached_tokens:
            compared[f"cached {cached_tokens}"] = runs = []
            for ids in windows:
                llm.reset_prefix_cache()
                llm.generate([ids[:cached_tokens + 1]], SamplingParams(max_tokens=1), use_tqdm=False)
                runs.append(llm.generate([ids], greedy, use_tqdm=False)[0])
                assert runs[-1].num_cached_tokens == cached_tokens, "the prefix was not served from the cache"
        llm.reset_prefix_cache()
        compared["batched"] = llm.generate(windows, greedy, use_tqdm=False)
        summary = {}
        for name, runs in compared.items():
            summary[name] = divergence.summarize([divergence.compare(r, c) for r, c in zip(runs, cold)],
                                                 args.max_tokens)
            summary[name]["bits_identical"] = sum(same_bits(r, c) for r, c in zip(runs, cold))
            summary[name]["max_logprob_delta"] = max(logprob_delta(r, c) for r, c in zip(runs, cold))
        summaries[domain] = summary
    return summaries


def speed_prompts(llm: LLM, long_tokens: int) -> dict[str, list[list[int]]]:
    """Windows of the reference text: one long prompt, one of 100 tokens, 16 of 256 (all different)."""
    ids = llm.get_tokenizer().encode(reference_text())
    return {"long": [ids[:long_tokens]], "short": [ids[long_tokens:long_tokens + 100]],
            "sixteen": [ids[long_tokens + 100 + 256 * i:long_tokens + 356 + 256 * i] for i in range(16)]}


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> float:
    llm.reset_prefix_cache()
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start


def speed(llm: LLM, prompts: dict[str, list[list[int]]]) -> dict[str, float]:
    """One round: the long prompt's prefill (s), batch-1 decode and 16 streams' output (tok/s)."""
    first = SamplingParams(temperature=0.0, max_tokens=1)
    decode = timed(llm, prompts["short"], SamplingParams(temperature=0.0, max_tokens=129, ignore_eos=True))
    sixteen = timed(llm, prompts["sixteen"], SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    return {"prefill_long_s": timed(llm, prompts["long"], first),
            "batch1_decode_tok_s": 128 / (decode - timed(llm, prompts["short"], first)),
            "sixteen_output_tok_s": 16 * 64 / sixteen}


def costs(llms: dict[str, LLM], args: argparse.Namespace) -> dict[str, dict[str, dict[str, float]]]:
    prompts = speed_prompts(next(iter(llms.values())), args.long_tokens)
    for llm in llms.values():
        speed(llm, prompts)  # warm-up, untimed
    rounds: dict[str, list[dict[str, float]]] = {mode: [] for mode in llms}
    for _ in range(args.repeats):
        for mode, llm in llms.items():
            rounds[mode].append(speed(llm, prompts))
    return {mode: {key: {"median": statistics.median(r[key] for r in runs), "min": min(r[key] for r in runs),
                         "max": max(r[key] for r in runs)} for key in runs[0]} for mode, runs in rounds.items()}


def run(args: argparse.Namespace) -> dict:
    llms = {mode: LLM(args.model, kv_cache_memory="512MiB", dtype=args.dtype, batch_invariant=MODES[mode])
            for mode in args.modes}
    first = next(iter(llms.values()))
    config = divergence.DivergenceConfig(prompts_per_domain=args.prompts_per_domain, prompt_tokens=args.prompt_tokens,
                                         max_tokens=args.max_tokens)
    prompts = divergence.domain_prompts(first, config, chat_renderer(first))
    result = {"invariance": {mode: invariance(llm, prompts, args) for mode, llm in llms.items()}}
    if args.repeats:
        result["costs"] = costs(llms, args)
    for llm in llms.values():
        llm.shutdown()
    return result


def report(result: dict, args: argparse.Namespace, model: str) -> str:
    cached = ", ".join(map(str, args.cached_tokens))
    names = [f"cached {n}" for n in args.cached_tokens] + ["batched"]
    lines = [f"Cache and batch invariance: greedy text and logprob bits of {args.prompt_tokens}-token windows of the "
             f"held-out texts ({args.max_tokens} tokens, top-2 logprobs), cold against prefixes of {cached} tokens "
             f"cached and against each domain's windows in one batch, model {model}, dtype {args.dtype}, "
             f"batch_invariant off and on. {now_iso()}", "", f"Machine: {describe_machine(machine_info())}", "",
             "Identical greedy text (text) and identical logprobs, bit for bit (bits), against the cold run; the "
             "largest logprob difference before any token differs; the cold run's top-2 gaps where the text differs.",
             "", "| batch_invariant | domain | " + " | ".join(f"{n}: text | {n}: bits" for n in names)
             + " | max logprob delta (nats) | top-2 gaps at divergence |", "|---|---|" + "---:|---:|" * len(names)
             + "---:|---|"]
    for mode, domains in result["invariance"].items():
        for domain, s in domains.items():
            cells = [f"{s[n]['identical']}/{s[n]['prompts']} | {s[n]['bits_identical']}/{s[n]['prompts']}"
                     for n in names]
            gaps = ", ".join(map(str, sorted(g for n in names for g in s[n]["top2_gaps_at_divergence"])))
            delta = max(s[n]["max_logprob_delta"] for n in names)
            lines.append(f"| {mode} | {domain} | {' | '.join(cells)} | {delta:.2g} | {gaps or '-'} |")
    if "costs" in result:
        lines += ["", f"Cost: medians (min-max) of {args.repeats} rounds, the modes alternating in each; a "
                      f"{args.long_tokens}-token prompt's prefill, batch-1 decode of 128 tokens after 100, 16 prompts "
                      "of 256 tokens continued by 64 each.", "",
                  "| batch_invariant | prefill (s) | batch-1 decode (tok/s) | 16 streams (output tok/s) |",
                  "|---|---:|---:|---:|"]
        for mode, figures in result["costs"].items():
            lines.append("| " + " | ".join([mode] + [f"{f['median']:.2f} ({f['min']:.2f}-{f['max']:.2f})"
                                                     for f in figures.values()]) + " |")
        if set(result["costs"]) == set(MODES):
            on, off = result["costs"]["on"], result["costs"]["off"]
            ratios = [f"{on[key]['median'] / off[key]['median']:.2f}×" for key in on]
            lines.append("| on ÷ off | " + " | ".join(ratios) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default=None, help="default: the embedded Gemma 3 270M")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), help="batch_invariant off, on")
    parser.add_argument("--prompts-per-domain", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=330)
    parser.add_argument("--cached-tokens", type=int, nargs="+", default=[256, 320],
                        help="prefixes cached before the warm runs (whole blocks of 16)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds of the cost (0: none)")
    parser.add_argument("--long-tokens", type=int, default=2000, help="the long prompt whose prefill is timed")
    parser.add_argument("--cpu-kind", default=None, help="the results file's CPU kind, e.g. zen4 (default: this CPU's)")
    parser.add_argument("--lock", type=Path, default=Path("/tmp/jido-bench.lock"))
    args = parser.parse_args(argv)
    with args.lock.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = run(args)
    model = args.model or "gemma-3-270m"
    text = report(result, args, model)
    print(text)
    variant = model if args.dtype == "auto" else f"{model}-{args.dtype}"
    stem = f"cache_invariance-{datetime.date.today().isoformat()}-{args.cpu_kind or cpu_kind()}-{variant}"
    (RESULTS / f"{stem}.md").write_text(text, encoding="utf-8")
    record = {"date": now_iso(), "machine": machine_info(), "settings": vars(args) | {"lock": str(args.lock)},
              **result}
    (RESULTS / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
