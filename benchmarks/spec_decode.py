"""Speculative decoding on the default model: what a verify step costs, what each method buys, what auto K picks.

Sections (``--only`` picks some; all by default), each against the plain engine in the same run:

- ``verify``: the model time of one step that verifies K proposals per request (K + 1 rows each) against a
  1-row step, at batch 1, 8 and 32: what speculation can buy on this machine.
- ``speed``: output tok/s per configuration, interleaved rounds, median of ``--repeats``: n-gram at batch 1
  on the input-grounded ``rewrite`` prompts of ``jido bench``, draft methods at batch 1 on open-ended text
  (``random`` windows of the pydoc text), automatic K at 32 streams, and the real pair: Qwen2.5-Coder-0.5B-Instruct
  drafting for Qwen2.5-Coder-1.5B-Instruct on coding requests (``--cases qwen-pair-batch1``; both installed),
  and the EAGLE draft and Medusa heads `jido train-draft` wrote to ``~/.cache/jido/drafts/gemma3-270m-eagle`` and
  ``-medusa`` on windows of the pydoc topics they never trained on (``--cases eagle-batch1 medusa-batch1``).
- ``auto``: the model automatic K fitted (per-position acceptance, pass costs) and the K it chose at batch
  1, 8 and 32.
- ``agreement``: greedy tokens with and without speculation on every engine fixture prompt, and where they
  part the top-2 gap there.

    flock /tmp/jido-bench.lock .venv/bin/python benchmarks/spec_decode.py --repeats 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from jido import LLM, SamplingParams
from jido.bench.config import BenchConfig
from jido.bench.corpus import Corpus
from jido.bench.datasets import sample_requests
from jido.bench.machine import cpu_kind, machine_info, now_iso
from jido.bench.tokens import TokenizerJsonCounter
from jido.models.loader import resolve_model
from jido.tools.train_draft import held_out_text
from jido.utils.reference_text import reference_text

RESULTS = Path(__file__).parent / "results"
FIXTURE = Path(__file__).parent.parent / "tests" / "fixtures" / "gemma3_reference.json"
NGRAM = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}
KV = "512MiB"
QWEN_TARGET, QWEN_DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
# `jido train-draft --method eagle|medusa --out` these folders train the drafts the eagle and medusa cases measure.
EAGLE = Path.home() / ".cache" / "jido" / "drafts" / "gemma3-270m-eagle"
MEDUSA = Path.home() / ".cache" / "jido" / "drafts" / "gemma3-270m-medusa"


def ngram(k: int | str) -> dict:
    return {**NGRAM, "num_speculative_tokens": k}


def self_draft(num_layers: int, k: int = 3) -> dict:
    return {"method": "draft_model", "num_layers": num_layers, "num_speculative_tokens": k}


def qwen_draft(k: int | str) -> dict:
    return {"method": "draft_model", "model": QWEN_DRAFT, "num_speculative_tokens": k}


def eagle(k: int | str, folder: Path = EAGLE, quantization: str | None = None) -> dict:
    return {"method": "eagle", "model": str(folder), "num_speculative_tokens": k,
            **({"quantization": quantization} if quantization else {})}


def medusa(k: int | str, folder: Path = MEDUSA) -> dict:
    return {"method": "medusa", "model": str(folder), "num_speculative_tokens": k}


# -- verify -------------------------------------------------------------------------------------------------
def verify_cost(batch: int, ks: list[int], steps: int, context: int) -> list[dict]:
    """Median model time of a step of ``batch`` requests each verifying K proposals (all rejected: one token)."""
    llm = LLM(kv_cache_memory=KV, speculative_config=ngram(max(ks)))
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"v{i}", [2] + [1000 + (i * 7919 + j * 31) % 200000 for j in range(context - 1)], params)
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.core.scheduler.requests.values()):
        engine.step()
    rows = []
    for k in ks:
        times = []
        for _ in range(steps):
            core = engine.core
            for request in core.scheduler.running:
                request.spec_token_ids = [3] * k  # token 3 never follows: every proposal is verified and rejected
            sched = core.scheduler.schedule()
            out = core.executor.execute_model(sched)
            core.scheduler.update_from_output(sched, out)
            times.append(out.model_time_s)
        rows.append({"batch": batch, "k": k, "rows": batch * (k + 1),
                     "model_ms": statistics.median(times[2:]) * 1e3})
    base = rows[0]["model_ms"]
    for row in rows:
        row["vs_one_row"] = row["model_ms"] / base
    llm.shutdown()
    return rows


# -- speed --------------------------------------------------------------------------------------------------
# Coding requests for the Qwen pair, in Qwen's ChatML (the chat template's form of one user turn).
CODING = [
    "Write a Python function that parses an ISO 8601 date string and returns a datetime, with tests.",
    "Implement a least-recently-used cache class in Python with get and put in O(1), and explain it.",
    "Write a Python script that counts the words of a text file and prints the ten most common ones.",
    "Write a binary search over a sorted Python list that returns the insertion point, with doctests.",
    "Write a Python generator that yields the lines of a large file in reverse order without reading it whole.",
    "Implement merge sort in Python for a list of integers and give its time complexity.",
]


def prompts_for(dataset: str, num: int, input_len: int, output_len: int) -> list[str]:
    if dataset == "coding":
        return [f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n" for text in CODING[:num]]
    folder = resolve_model(None)
    # "held-out": open-ended windows of the pydoc topics `jido train-draft` never trains on.
    text = held_out_text() if dataset == "held-out" else reference_text()
    corpus = Corpus(text, TokenizerJsonCounter(folder / "tokenizer.json"))
    config = BenchConfig(dataset_name="random" if dataset == "held-out" else dataset, num_prompts=num,
                         random_input_len=input_len, random_output_len=output_len, random_range_ratio=0.0, seed=0)
    return [r.prompt for r in sample_requests(config, corpus)]


def run_workload(llm: LLM, prompts: list[str], batch: int, output_len: int) -> dict:
    """Output tok/s over ``prompts`` generated ``batch`` at a time (greedy, ``output_len`` each)."""
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    before = llm.llm_engine.get_scheduler_stats().spec_decoding
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), batch):
        tokens += sum(len(o.outputs[0].token_ids) for o in llm.generate(prompts[i:i + batch], params, use_tqdm=False))
    seconds = time.perf_counter() - start
    after = llm.llm_engine.get_scheduler_stats().spec_decoding
    drafts = after.num_drafts - before.num_drafts
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    return {"tok_s": tokens / seconds, "mean_acceptance_length": 1 + accepted / drafts if drafts else None}


def speed(cases: list[dict], repeats: int) -> list[dict]:
    """Each case: a workload and configurations, baseline first; ratios are paired per round, then the median."""
    results = []
    for case in cases:
        prompts = prompts_for(case["dataset"], case["num_prompts"], case["input_len"], case["output_len"])
        llms = {name: LLM(case.get("model"), kv_cache_memory=KV, speculative_config=config)
                for name, config in case["configs"].items()}
        for llm in llms.values():  # warm-up: kernels built and loaded, caches touched
            llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        rounds: dict[str, list[dict]] = {name: [] for name in llms}
        for _ in range(repeats):
            for name, llm in llms.items():
                llm.reset_prefix_cache()  # every round prefills its prompts again
                rounds[name].append(run_workload(llm, prompts, case["batch"], case["output_len"]))
        base = [r["tok_s"] for r in rounds["baseline"]]
        for name, runs in rounds.items():
            ratios = [r["tok_s"] / b for r, b in zip(runs, base)]
            results.append({**{k: case[k] for k in ("label", "dataset", "batch", "num_prompts", "input_len",
                                                      "output_len")}, "model": case.get("model"),
                            "config": name, "speculative_config": case["configs"][name],
                            "tok_s_median": statistics.median(r["tok_s"] for r in runs),
                            "tok_s_runs": [r["tok_s"] for r in runs], "ratio_median": statistics.median(ratios),
                            "ratio_runs": ratios, "mean_acceptance_length": runs[-1]["mean_acceptance_length"]})
        for llm in llms.values():
            llm.shutdown()
    return results


# -- auto ---------------------------------------------------------------------------------------------------
def _auto_state(worker: Any) -> dict:
    auto = worker.runner.spec_decoder.auto_k
    return {"acceptance_rates": auto.acceptance.rates(),
            "verify_cost_ms": dict(zip(auto.verify_cost.sizes, [s * 1e3 for s in auto.verify_cost.seconds])),
            "draft_cost_ms_per_token": dict(zip(auto.draft_cost.sizes, [s * 1e3 for s in auto.draft_cost.seconds])),
            "chosen": {f"{b}:{k}": n for (b, k), n in sorted(auto.chosen.items())}}


def auto_fit(batches: list[int], output_len: int) -> dict:
    llm = LLM(kv_cache_memory=KV, speculative_config=ngram("auto"))
    prompts = prompts_for("rewrite", max(batches), 256, output_len)
    fits = {}
    for batch in batches:
        run_workload(llm, prompts[:batch], batch, output_len)
        fits[batch] = llm.collective_rpc(_auto_state)[0]
    llm.shutdown()
    return fits


# -- agreement ----------------------------------------------------------------------------------------------
def agreement(configs: dict[str, dict]) -> list[dict]:
    reference = json.loads(FIXTURE.read_text(encoding="utf-8"))
    gens = reference["generations"]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    plain = LLM(kv_cache_memory=KV, dtype="float32")
    base = [o.outputs[0].token_ids for o in plain.generate([g["prompt_ids"] for g in gens], params, use_tqdm=False)]
    rows = []
    for name, config in configs.items():
        spec = LLM(kv_cache_memory=KV, dtype="float32", speculative_config=config)
        for gen, theirs in zip(gens, base):  # one prompt at a time, as a batch-1 user sees it
            ours = spec.generate([gen["prompt_ids"]], params, use_tqdm=False)[0].outputs[0].token_ids
            step = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
            rows.append({"config": name, "prompt": gen["name"], "identical": step is None, "first_difference": step,
                         "top2_gap_there": None if step is None else gen["top2_gaps"][step]})
        spec.shutdown()
    return rows


SPEED_CASES = ("ngram-batch1", "draft-batch1", "auto-32-streams", "qwen-pair-batch1", "eagle-batch1", "medusa-batch1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=["verify", "speed", "auto", "agreement"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", nargs="*", default=list(SPEED_CASES[:3]), choices=list(SPEED_CASES),
                        help="the speed section's cases to run")
    parser.add_argument("--num-prompts", type=int, default=6, help="prompts per batch-1 workload")
    parser.add_argument("--output-len", type=int, default=96)
    parser.add_argument("--out", default=str(RESULTS / f"spec_decode-{now_iso()[:10]}-{cpu_kind()}.json"))
    parser.add_argument("--eagle-drafts", nargs="+", type=Path, default=[EAGLE],
                        help="EAGLE draft folders: the eagle case's configs use the first; each other adds a K = 3 "
                             "config of its own, so drafts compare in one run")
    args = parser.parse_args()
    result: dict[str, Any] = {"date": now_iso(), "machine": machine_info()}
    if "verify" in args.only:
        result["verify"] = [row for batch in (1, 8, 32)
                            for row in verify_cost(batch, [0, 1, 2, 3, 4, 6, 8, 15, 16], steps=7, context=256)]
    if "speed" in args.only:
        n, out = args.num_prompts, args.output_len
        first, *others = args.eagle_drafts
        cases = dict(zip(SPEED_CASES, [
            {"label": "n-gram, batch 1, input-grounded", "dataset": "rewrite", "batch": 1, "num_prompts": n,
             "input_len": 256, "output_len": out,
             "configs": {"baseline": None, "ngram k=4": ngram(4), "ngram k=8": ngram(8), "ngram auto": ngram("auto")}},
            {"label": "draft, batch 1, open-ended", "dataset": "random", "batch": 1, "num_prompts": n,
             "input_len": 256, "output_len": out,
             "configs": {"baseline": None, "self-draft 12 layers": self_draft(12), "ngram auto": ngram("auto")}},
            {"label": "auto K, 32 streams", "dataset": "random", "batch": 32, "num_prompts": 32, "input_len": 256,
             "output_len": out, "configs": {"baseline": None, "ngram auto": ngram("auto")}},
            # Two engines only: the configs of a case are held at once, and on an AMX CPU one 1.5B engine holds
            # 10.3 GB (codes, panels and bf16 copies), with its 0.5B draft 20.6 GB of the machine's 24.
            {"label": "Qwen pair, batch 1, coding", "dataset": "coding", "batch": 1, "num_prompts": n, "input_len": 0,
             "output_len": out, "model": QWEN_TARGET,
             "configs": {"baseline": None, "draft 0.5B k=3": qwen_draft(3)}},
            {"label": "EAGLE, batch 1, open-ended held-out text", "dataset": "held-out", "batch": 1,
             "num_prompts": n, "input_len": 256, "output_len": out,
             "configs": {"baseline": None, "eagle k=2": eagle(2, first), "eagle k=3": eagle(3, first),
                         "eagle auto": eagle("auto", first), "eagle int8 k=3": eagle(3, first, quantization="int8"),
                         **{f"eagle k=3 ({folder.name})": eagle(3, folder) for folder in others}}},
            {"label": "Medusa, batch 1, open-ended held-out text", "dataset": "held-out", "batch": 1,
             "num_prompts": n, "input_len": 256, "output_len": out,
             "configs": {"baseline": None, "medusa k=1": medusa(1), "medusa k=2": medusa(2), "medusa k=3": medusa(3),
                         "medusa auto": medusa("auto")}},
        ]))
        result["speed"] = speed([cases[name] for name in args.cases], args.repeats)
    if "auto" in args.only:
        result["auto"] = auto_fit([1, 8, 32], args.output_len)
    if "agreement" in args.only:
        configs = {"ngram k=4": ngram(4), "self-draft 12 layers": self_draft(12)}
        draft = args.eagle_drafts[0]
        result["agreement"] = agreement({**configs, **({"eagle k=3": eagle(3, draft)} if draft.is_dir() else {})})
    Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))


if __name__ == "__main__":
    main()
