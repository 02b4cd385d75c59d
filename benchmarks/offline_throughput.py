"""Offline throughput: jido against transformers' generate on the same prompts, in the same run.

(a) batch 1: one ~32-token prompt, 128 greedy tokens: TTFT and decode tokens/s;
(b) batched: 32 prompts of ~256 tokens (192 to 320, seeded), 128 greedy tokens each, submitted together:
    output tokens/s. transformers pads them on the left to the longest; jido's flat batches do not pad.
Every figure is the median of ``--repeats`` runs; jido's step time is split into model (of which
attention), sampling and the rest (scheduling, input building, detokenization: Python overhead). Ratios
are jido ÷ transformers for every figure (below 1 is better for TTFT). The result records the CPU (model,
ISA, key flags), torch and oneDNN versions, so benchmarks/compare.py can tie it to a run of the same day,
CPU and dtype.

    .venv/bin/python benchmarks/offline_throughput.py [--repeats 3] [--dtype float32] [--only batch1]
"""
from __future__ import annotations

import argparse
import datetime
import inspect
import json
import random
import statistics
import time
from pathlib import Path

import torch

from jido import LLM, SamplingParams
from jido.bench.machine import cpu_kind, machine_info
from jido.tools.roofline import onednn_version

RESULTS = Path(__file__).parent / "results"


def corpus_token_ids(llm: LLM) -> list[int]:
    """Real English text from the standard library's documentation, tokenized once."""
    import argparse as a, collections, email, json as j, logging, textwrap, unittest
    text = "\n\n".join(inspect.getdoc(m) or "" for m in (a, collections, email, j, logging, textwrap, unittest))
    text += "\n\n" + inspect.getsource(textwrap)
    return llm.get_tokenizer().encode(text, add_special_tokens=False)


def make_prompts(ids: list[int], bos: int, num: int, length: int, spread: float = 0.0) -> list[list[int]]:
    """``num`` distinct windows of the corpus, lengths uniform in length * (1 ± spread), seeded."""
    rng = random.Random(0)
    lengths = [round(length * (1 + rng.uniform(-spread, spread))) for _ in range(num)]
    starts = [sum(lengths[:i]) for i in range(num)]
    return [[bos] + ids[s:s + n - 1] for s, n in zip(starts, lengths)]


class AttentionTimer:
    """Wraps the attention backend's forward to add up the time spent in it."""

    def __init__(self, llm: LLM) -> None:
        self.total = 0.0
        # The backend lives in the worker, behind the executor: time its class's forward (in-process runs only).
        backend_cls = type(llm.llm_engine.collective_rpc(_attention_backend)[0])
        inner = backend_cls.forward

        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = inner(*args, **kwargs)
            self.total += time.perf_counter() - start
            return out

        backend_cls.forward = timed


def _attention_backend(worker):
    return worker.runner.attn_backend


def run_jido(llm: LLM, prompts: list[list[int]], max_tokens: int, timer: AttentionTimer) -> dict:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    engine = llm.llm_engine
    engine.reset_prefix_cache()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"bench-{time.perf_counter_ns()}-{i}", prompt, params)
    split = {"schedule": 0.0, "model": 0.0, "sample": 0.0, "update": 0.0}
    timer.total = 0.0
    start, first_token, steps = time.perf_counter(), None, 0
    num_out = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        steps += 1
        if first_token is None and outputs:
            first_token = time.perf_counter()
        num_out += sum(len(o.outputs[0].token_ids) for o in outputs)  # deltas: this step's tokens
        last = engine.last_iteration_stats
        for key in split:
            split[key] += getattr(last, f"{key}_s")
    elapsed = time.perf_counter() - start
    return {"elapsed_s": elapsed, "ttft_s": first_token - start, "output_tokens": num_out, "steps": steps,
            "decode_tok_s": (num_out - len(prompts)) / (elapsed - (first_token - start)),
            "output_tok_s": num_out / elapsed, "attention_s": timer.total,
            "other_s": elapsed - sum(split.values()), **{f"{k}_s": v for k, v in split.items()}}


def run_transformers(model, prompts: list[list[int]], max_tokens: int, pad_id: int) -> dict:
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=1, min_new_tokens=1,
                       do_sample=False, pad_token_id=pad_id)
        ttft = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False, pad_token_id=pad_id)
        elapsed = time.perf_counter() - start
    num_out = (out.shape[1] - width) * len(prompts)
    return {"elapsed_s": elapsed, "ttft_s": ttft, "output_tokens": num_out, "output_tok_s": num_out / elapsed,
            "decode_tok_s": (num_out - len(prompts)) / max(elapsed - ttft, 1e-9)}


def median_run(fn, repeats: int) -> dict:
    runs = [fn() for _ in range(repeats)]
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


# Every ratio is jido ÷ transformers, named by the figure it divides.
RATIO_NOTE = "jido ÷ transformers: above 1 is better for tok/s, below 1 is better for ttft_s"
RATIOS = {"batch1_decode_tok_s": ("batch1", "decode_tok_s"), "batch1_ttft_s": ("batch1", "ttft_s"),
          "batch32_output_tok_s": ("batch32", "output_tok_s")}


def ratios(results: dict) -> dict:
    """jido ÷ transformers for each figure of :data:`RATIOS` both measured."""
    jido, theirs = results.get("jido", {}), results.get("transformers", {})
    return {name: jido[run][key] / theirs[run][key] for name, (run, key) in RATIOS.items()
            if run in jido and run in theirs}


def machine() -> dict:
    """The shared machine record (CPU model, flags, bandwidth) with the torch build and threads this run used."""
    return machine_info() | {"torch": torch.__version__, "onednn": onednn_version(),
                             "torch_threads": torch.get_num_threads()}


def chosen_runs(only: str | None) -> tuple[str, ...]:
    """The result keys of the runs `--only` asks for: batch 1, the batched run (32 prompts), or both."""
    return {None: ("batch1", "batch32"), "batch1": ("batch1",), "batched": ("batch32",)}[only]


def measure(args: argparse.Namespace) -> dict:
    """The chosen runs of jido and, unless skipped, transformers."""
    runs = chosen_runs(args.only)
    llm = LLM(dtype=args.dtype, kv_cache_memory="2GiB", distributed_executor_backend=args.distributed_executor_backend)
    timer = AttentionTimer(llm)
    ids = corpus_token_ids(llm)
    bos = llm.get_tokenizer().bos_token_id
    prompts = {"batch1": make_prompts(ids, bos, 1, 32), "batch32": make_prompts(ids[32:], bos, 32, 256, spread=0.25)}
    run_jido(llm, prompts["batch1"], 8, timer)  # warm-up
    results = {"jido": {run: median_run(lambda: run_jido(llm, prompts[run], 128, timer), args.repeats)
                        for run in runs}}
    if not args.skip_transformers:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(llm.llm_engine.model_folder,
                                                     dtype=getattr(torch, args.dtype)).eval()
        pad = llm.get_tokenizer().pad_token_id or 0
        results["transformers"] = {run: median_run(lambda: run_transformers(model, prompts[run], 128, pad),
                                                   args.repeats) for run in runs}
        results["ratio_jido_over_transformers"] = ratios(results)
        results["ratio_note"] = RATIO_NOTE
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--only", choices=["batch1", "batched"], help="run only batch 1 or only the batched run")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--distributed-executor-backend", default="uni", choices=["uni", "mp"])
    parser.add_argument("--tag", default="", help="appended to the result file's name")
    args = parser.parse_args(argv)
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine(),
              "dtype": args.dtype, "executor": args.distributed_executor_backend, "repeats": args.repeats,
              "results": measure(args)}
    RESULTS.mkdir(exist_ok=True)
    only = f"-{args.only}" if args.only else ""
    path = RESULTS / f"offline_throughput-{datetime.date.today()}-{cpu_kind()}-{args.dtype}{only}{args.tag}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
