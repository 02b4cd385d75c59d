"""How far bfloat16 (or any engine setting) moves Gemma 3 270M's logits from float32, on the test fixture's prompts.

For every fixture prompt both settings (``--candidate``, default ``dtype=bfloat16``; ``--reference``, default
``dtype=float32 quantization=none``: float weights, nothing rounded) decode greedily with the top-20 logprobs of each step. Along
the steps where the two texts still agree, the error that matters for a greedy choice is the error in
the gap between float32's top two tokens: ``|gap_bf16 - gap_fp32|`` (a logprob difference is a logit
difference). A bf16 run may pick another token only where float32's gap is below that error; the test
(`tests/engine/test_bf16_accuracy.py`) uses the measured maximum, with margin, as its threshold. Also
recorded: where each prompt's bf16 text first diverges from transformers' float32 one, and the float32
gap at that step.

    .venv/bin/python benchmarks/bf16_accuracy.py
    .venv/bin/python benchmarks/bf16_accuracy.py --candidate dtype=float32   # the default gguf kernels
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from jido import LLM, SamplingParams
from jido.bench.machine import cpu_kind, now_iso
from jido.utils.cpu import cpu_info

FIXTURE = Path(__file__).parent.parent / "tests" / "fixtures" / "gemma3_reference.json"
RESULTS = Path(__file__).parent / "results"


def decode(llm: LLM, prompt_ids: list[int], steps: int) -> list[tuple[int, dict[int, float]]]:
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True, logprobs=20)
    out = llm.generate([prompt_ids], params, use_tqdm=False)[0].outputs[0]
    return [(t, dict(zip(step.top_token_ids, step.top_logprobs))) for t, step in zip(out.token_ids, out.logprobs)]


def gap_errors(fp32: list, bf16: list) -> list[float]:
    """``|gap_bf16 - gap_fp32|`` of float32's top two tokens, at every step before the texts diverge (``bf16``:
    the candidate's steps)."""
    errors = []
    for (t32, lp32), (t16, lp16) in zip(fp32, bf16):
        first, second = sorted(lp32, key=lp32.get, reverse=True)[:2]
        if first in lp16 and second in lp16:
            errors.append(abs((lp16[first] - lp16[second]) - (lp32[first] - lp32[second])))
        if t32 != t16:
            break
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidate", nargs="*", default=["dtype=bfloat16"], help="engine settings, k=v")
    parser.add_argument("--reference", nargs="*", default=["dtype=float32", "quantization=none"],
                        help="engine settings, k=v")
    args = parser.parse_args()
    reference = json.loads(FIXTURE.read_text(encoding="utf-8"))
    settings = {name: dict(kv.split("=", 1) for kv in getattr(args, name)) for name in ("reference", "candidate")}
    runs = {name: LLM(kv_cache_memory="160MiB", **kwargs) for name, kwargs in settings.items()}
    rows = []
    for gen in reference["generations"]:
        steps = len(gen["output_ids"])
        fp32, candidate = (decode(runs[name], gen["prompt_ids"], steps) for name in ("reference", "candidate"))
        candidate_ids = [t for t, _ in candidate]
        diverge = next((i for i, (a, b) in enumerate(zip(candidate_ids, gen["output_ids"])) if a != b), None)
        errors = gap_errors(fp32, candidate)
        rows.append({"name": gen["name"], "prompt_tokens": len(gen["prompt_ids"]), "steps": steps,
                     "first_divergence_from_transformers": diverge,
                     "fp32_gap_at_divergence": None if diverge is None else gen["top2_gaps"][diverge],
                     "max_gap_error": max(errors), "median_gap_error": sorted(errors)[len(errors) // 2]})
        print(rows[-1])
    result = {"date": now_iso(), "cpu": cpu_info().as_dict(), "settings": settings, "prompts": rows,
              "max_gap_error": max(r["max_gap_error"] for r in rows)}
    tag = "" if settings["candidate"] == {"dtype": "bfloat16"} else "-" + "-".join(
        f"{k}={v}" for k, v in settings["candidate"].items())
    path = RESULTS / f"bf16_accuracy-{result['date'][:10]}-{cpu_kind(result['cpu'])}{tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"max gap error {result['max_gap_error']:.4f}; wrote {path}")


if __name__ == "__main__":
    main()
