"""CacheBlend on a RAG-style set: time to first token and quality against a full prefill, and against naive reuse.

Documents are windows of the pydoc topics text (``--num-documents`` of ``--document-len`` tokens); each prompt
is ``--chunks-per-prompt`` of them, in its own order, then a question quoting one of them. Per prompt and per
recompute ratio (0 is naive reuse: every chunk's KV as cached alone, keys re-rotated, nothing recomputed):

- TTFT: wall time of a one-token request once its chunks are cached (the blend step itself), against a full
  prefill of the same token ids with an empty prefix cache;
- quality of the first token's distribution: KL(full || blend) over the whole vocabulary (the runner's logits,
  read through a hook on ``compute_logits`` of the in-process worker) and whether the top token agrees;
- greedy agreement: the tokens of a ``--max-tokens`` greedy answer that match the full prefill's before the
  first difference.

    flock /tmp/jido-bench.lock env PYTHONPATH=. .venv/bin/python benchmarks/cache_blend.py
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from jido import LLM, SamplingParams
from jido.bench.machine import cpu_kind, machine_info, now_iso
from jido.utils.reference_text import reference_text

RESULTS = Path(__file__).parent / "results"


class LogitsTap:
    """The logits of the last ``compute_logits`` call of the engine's in-process model."""

    def __init__(self, llm: LLM) -> None:
        model = llm.llm_engine.core.executor.worker.runner.model
        self.last: torch.Tensor | None = None
        compute = model.compute_logits

        def tapped(hidden: torch.Tensor) -> torch.Tensor:
            self.last = compute(hidden)
            return self.last

        model.compute_logits = tapped

    def first_token_log_probs(self) -> torch.Tensor:
        return torch.log_softmax(self.last[-1].double(), dim=-1)


def documents(llm: LLM, num: int, length: int, seed: int) -> list[list[int]]:
    """``num`` distinct windows of ``length`` tokens of the pydoc text (no BOS: chunks follow the head)."""
    ids = llm.get_tokenizer().encode(reference_text(), add_special_tokens=False)
    starts = np.random.default_rng(seed).choice(len(ids) // length, num, replace=False) * length
    return [ids[s:s + length] for s in starts]


def prompts(docs: list[list[int]], per_prompt: int, num: int, seed: int) -> list[dict]:
    """Blend prompts: a random choice and order of documents, then a question quoting one of them."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for _ in range(num):
        chosen = [int(i) for i in rng.choice(len(docs), per_prompt, replace=False)]
        quoted = docs[chosen[int(rng.integers(per_prompt))]]
        at = int(rng.integers(len(quoted) - 8))
        question = "\n\nQuestion: what does the documentation above say right after \""
        out.append({"docs": chosen, "question": question, "quote": quoted[at:at + 8]})
    return out


def blend_prompt(llm: LLM, prompt: dict, docs: list[list[int]], ratio: float) -> dict:
    question = llm.get_tokenizer().encode(prompt["question"], add_special_tokens=False) + prompt["quote"]
    return {"prompt_token_ids": question,
            "kv_blend": {"chunks": [docs[i] for i in prompt["docs"]], "recompute_ratio": ratio}}


def timed(llm: LLM, prompt: dict, params: SamplingParams) -> tuple[float, list[int]]:
    start = time.perf_counter()
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    return time.perf_counter() - start, out.outputs[0].token_ids


def agreeing(reference: list[int], tokens: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(reference, tokens)) if a != b), min(len(reference), len(tokens)))


def run_prompt(llm: LLM, tap: LogitsTap, prompt: dict, docs: list[list[int]], ratios: list[float],
               max_tokens: int) -> dict:
    one = SamplingParams(temperature=0, max_tokens=1)
    answer = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ids = llm.llm_engine.prepare_prompt(blend_prompt(llm, prompt, docs, 0.0)).token_ids
    llm.reset_prefix_cache()
    full_s, _ = timed(llm, {"prompt_token_ids": ids}, one)
    full = tap.first_token_log_probs()
    llm.reset_prefix_cache()
    _, full_answer = timed(llm, {"prompt_token_ids": ids}, answer)
    row = {"prompt_tokens": len(ids), "full_ttft_s": full_s, "ratios": {}}
    for ratio in ratios:
        llm.reset_prefix_cache()
        timed(llm, blend_prompt(llm, prompt, docs, ratio), one)  # caches each chunk alone, then blends
        blend_s, _ = timed(llm, blend_prompt(llm, prompt, docs, ratio), one)
        blended = tap.first_token_log_probs()
        kl = float((full.exp() * (full - blended)).sum())
        _, blend_answer = timed(llm, blend_prompt(llm, prompt, docs, ratio), answer)
        row["ratios"][str(ratio)] = {
            "ttft_s": blend_s, "kl": kl, "top1_agrees": bool(full.argmax() == blended.argmax()),
            "agreeing_tokens": agreeing(full_answer, blend_answer)}
    return row


def summarize(rows: list[dict], ratios: list[float], max_tokens: int) -> dict:
    full = statistics.median(r["full_ttft_s"] for r in rows)
    out = {"median_full_ttft_s": full}
    for ratio in ratios:
        cells = [r["ratios"][str(ratio)] for r in rows]
        ttft = statistics.median(c["ttft_s"] for c in cells)
        out[str(ratio)] = {
            "median_ttft_s": ttft, "ttft_ratio_to_full": ttft / full,
            "median_kl": statistics.median(c["kl"] for c in cells), "max_kl": max(c["kl"] for c in cells),
            "top1_agreement": sum(c["top1_agrees"] for c in cells) / len(cells),
            "greedy_agreeing_share": sum(c["agreeing_tokens"] for c in cells) / (max_tokens * len(cells))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-documents", type=int, default=6)
    parser.add_argument("--document-len", type=int, default=384)
    parser.add_argument("--chunks-per-prompt", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.0, 0.15, 0.3, 1.0])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="default: jido's default model")
    parser.add_argument("--output", default=str(RESULTS / f"cache_blend-{now_iso()[:10]}-{cpu_kind()}.json"))
    args = parser.parse_args()
    llm = LLM(args.model, kv_cache_memory="256MiB", max_num_batched_tokens=4096)
    tap = LogitsTap(llm)
    docs = documents(llm, args.num_documents, args.document_len, args.seed)
    timed(llm, "warm up the kernels", SamplingParams(max_tokens=2))
    rows = []
    for prompt in prompts(docs, args.chunks_per_prompt, args.num_prompts, args.seed):
        rows.append(run_prompt(llm, tap, prompt, docs, args.ratios, args.max_tokens))
        print(json.dumps(rows[-1]), flush=True)
    result = {"date": now_iso(), "machine": machine_info(), "args": vars(args),
              "summary": summarize(rows, args.ratios, args.max_tokens), "rows": rows}
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
