"""Each quantization scheme on the default model, in one run: weight bytes, speed, agreement, perplexity.

For every variant (``--variant NAME:key=value,key=value``; engine keywords such as ``quantization`` and
``dtype``) it loads Gemma 3 270M once and measures, interleaved over ``--repeats`` rounds so drift on a
shared machine hits all alike: batch-1 and batch-32 decode step (``decode_step.time_decode``), the prefill
of one ``--prefill``-token prompt, greedy agreement over the engine fixtures' prompts (tokens equal to the
first variant's, and to transformers' float32 text), and perplexity on Python's pydoc topics text with
llama.cpp's method (``jido.tools.perplexity``). Every figure is the median over rounds, with the ratio to
the first variant.

    .venv/bin/python benchmarks/quantization.py --repeats 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from decode_step import time_decode

from jido import LLM, SamplingParams
from jido.bench.machine import cpu_kind, machine_info, now_iso
from jido.tools.roofline import held_weight_bytes

RESULTS = Path(__file__).parent / "results"
FIXTURE = Path(__file__).parent.parent / "tests" / "fixtures" / "gemma3_reference.json"
# The first is the baseline of every ratio: float weights in the dtype auto picks (bf16 or float32 by the CPU).
DEFAULT_VARIANTS = ["dense:quantization=none,dtype=auto", "gguf:quantization=gguf,dtype=auto",
                    "int8:quantization=int8,dtype=auto", "int4:quantization=int4,dtype=auto",
                    "w8a8:quantization=w8a8,dtype=auto"]


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``name:key=value,...`` -> (name, engine keywords); integers are converted."""
    name, _, settings = text.partition(":")
    kwargs: dict[str, Any] = {}
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition("=")
        kwargs[key] = int(value) if value.isdigit() else value
    return name, kwargs


def time_prefill(llm: LLM, tokens: int) -> float:
    """Seconds to prefill one ``tokens``-token prompt (no prefix-cache hit) and sample one token."""
    llm.llm_engine.reset_prefix_cache()
    prompt = [2] + [1000 + (j * 7919) % 200000 for j in range(tokens - 1)]
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)
    return time.perf_counter() - start


def greedy_runs(llm: LLM, fixture: dict) -> list[list[int]]:
    prompts = [{"prompt_token_ids": g["prompt_ids"]} for g in fixture["generations"]]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    return [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]


def agreement(ours: list[list[int]], reference: list[list[int]]) -> float:
    """Share of positions where the greedy tokens equal the reference's, up to each run's first divergence."""
    matched = sum(next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(y)) for x, y in zip(ours, reference))
    return matched / sum(len(y) for y in reference)


def perplexity(llm: LLM, text_path: Path, context: int, chunks: int) -> float:
    from jido.tools.perplexity import PerplexityConfig, evaluate

    config = PerplexityConfig(context_length=context, max_chunks=chunks)
    return evaluate(llm, text_path.read_text(encoding="utf-8"), config).perplexity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", help="NAME:key=value,... (repeatable; default: "
                        + " ".join(DEFAULT_VARIANTS) + ")")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each figure is the median over them")
    parser.add_argument("--context", type=int, default=512, help="decode context and perplexity chunk length")
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed per round")
    parser.add_argument("--prefill", type=int, default=2000, help="prompt tokens of the timed prefill")
    parser.add_argument("--ppl-chunks", type=int, default=20, help="perplexity chunks (0 skips perplexity)")
    parser.add_argument("--tag", default="", help="appended to the result file's name")
    args = parser.parse_args()
    variants = dict(parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS))
    fixture = json.loads(FIXTURE.read_text(encoding="utf-8"))
    from pydoc_data.topics import topics

    text_path = Path(tempfile.mkdtemp(prefix="jido-quant-")) / "pydoc_topics.txt"
    text_path.write_text("\n\n".join(topics[k] for k in sorted(topics)), encoding="utf-8")
    llms, rows = {}, {}
    for name, kwargs in variants.items():
        start = time.perf_counter()
        llms[name] = LLM(kv_cache_memory="2GiB", max_model_len=max(args.context, args.prefill) + 64,
                         max_num_seqs=32, **kwargs)
        rows[name] = {"variant": name, "settings": kwargs, "load_s": time.perf_counter() - start,
                      "weight_bytes": held_weight_bytes(llms[name])}
    samples: dict[str, dict[str, list[float]]] = {n: {} for n in variants}
    for r in range(args.repeats):
        for name, llm in llms.items():
            figures = {"decode_b1_ms": time_decode(llm, 1, args.context, args.steps)["step_ms"],
                       "decode_b32_ms": time_decode(llm, 32, args.context, args.steps)["step_ms"],
                       "prefill_s": time_prefill(llm, args.prefill)}
            for key, value in figures.items():
                samples[name].setdefault(key, []).append(value)
            print(f"round {r + 1}: {name}: " + " ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True)
    reference_runs = None
    for name, llm in llms.items():
        row = rows[name] | {k: statistics.median(v) for k, v in samples[name].items()} | {"runs": samples[name]}
        runs = greedy_runs(llm, fixture)
        reference_runs = reference_runs or runs
        row["greedy_agreement_vs_first"] = agreement(runs, reference_runs)
        row["greedy_agreement_vs_transformers_fp32"] = agreement(runs, [g["output_ids"] for g in fixture["generations"]])
        if args.ppl_chunks:
            row["perplexity"] = perplexity(llm, text_path, args.context, args.ppl_chunks)
        rows[name] = row
        print(f"{name}: {json.dumps({k: v for k, v in row.items() if k != 'runs'})}", flush=True)
    first = next(iter(rows.values()))
    for row in rows.values():
        row["ratios"] = {k: row[k] / first[k] for k in ("weight_bytes", "decode_b1_ms", "decode_b32_ms", "prefill_s",
                                                         "perplexity") if k in row and first.get(k)}
    result = {"date": now_iso(), "machine": machine_info() | {"torch": torch.__version__,
                                                              "torch_threads": torch.get_num_threads()},
              "model": "gemma-3-270m (Q4_K_M GGUF)", "context": args.context, "prefill_tokens": args.prefill,
              "ppl_chunks": args.ppl_chunks, "repeats": args.repeats, "rows": list(rows.values())}
    path = RESULTS / f"quantization-{result['date'][:10]}-{cpu_kind(result['machine'])}{args.tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
