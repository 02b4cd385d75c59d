"""What a grammar costs a decode step: time per output token of 16 streams under a JSON schema against 16 free
streams, on the same engine in one run (issue 55's target: TPOT at most 1.10x unconstrained).

For each model, an engine at its default quantization and dtype takes ``--streams`` prompts per round. Rounds
alternate, free then constrained, ``--repeats`` times each; a round waits until every stream has its first token
and then times ``--steps`` engine steps, each giving every stream one token, so a step's wall time is the
streams' TPOT. The constraint is a JSON schema whose answer is longer than the timed steps (an array of
``--steps`` strings, bounded by ``--max-lengths`` or not), so no stream ends inside the window. A round reports
its median step; the result is the median over rounds, with the time the scheduler spent filling masks
(``fill_bitmasks``) per step beside it.
The first constrained round is a warm-up (it builds the vocabulary's token trie) and is not counted. Run alone,
under the lock:

    flock /tmp/jido-bench.lock env PYTHONPATH=. .venv/bin/python benchmarks/grammar_cost.py \\
        [--models gemma-3-270m qwen2.5-coder-0.5b-instruct] [--streams 16] [--steps 48] [--repeats 3] \\
        [--out benchmarks/results/grammar_cost-<date>-<cpu kind>.json (the default)]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jido.core.scheduler as scheduler_module
from jido.bench.machine import cpu_kind, machine_info, now_iso
from jido.config import EngineConfig
from jido.core.sampling_params import SamplingParams, StructuredOutputsParams
from jido.engine.llm_engine import LLMEngine

TOPICS = ["rivers", "birds", "tools", "colours", "cities", "fruits", "metals", "games", "trees", "stars", "ships",
          "songs", "rocks", "fish", "clouds", "bridges"]


def schema(num_items: int, max_length: int | None) -> dict:
    """An object holding an array of ``num_items`` strings, each at most ``max_length`` characters where given."""
    item = {"type": "string", "minLength": 1} | ({"maxLength": max_length} if max_length else {})
    return {"type": "object", "additionalProperties": False, "required": ["items"],
            "properties": {"items": {"type": "array", "minItems": num_items, "maxItems": num_items, "items": item}}}


class MaskClock:
    """Wall time the scheduler spends in ``fill_bitmasks`` while the clock is entered (wrapped where the scheduler
    looks it up, and put back on exit)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._fill = scheduler_module.fill_bitmasks

    def __enter__(self) -> MaskClock:
        scheduler_module.fill_bitmasks = self._timed
        return self

    def __exit__(self, *exc_info: object) -> None:
        scheduler_module.fill_bitmasks = self._fill

    def _timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._fill(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def run_round(engine: LLMEngine, tag: str, params: SamplingParams, streams: int, steps: int,
              clock: MaskClock) -> dict:
    ids = [f"{tag}-{i}" for i in range(streams)]
    for req_id, topic in zip(ids, TOPICS * (streams // len(TOPICS) + 1)):
        engine.add_request(req_id, f"A JSON list of {topic}, one word each:", params)
    started: set[str] = set()
    while len(started) < streams:
        started |= {o.request_id for o in engine.step() if o.outputs[0].token_ids}
    times, mask_start = [], clock.seconds
    for _ in range(steps):
        start = time.perf_counter()
        outputs = engine.step()
        times.append(time.perf_counter() - start)
        if any(o.finished for o in outputs):
            raise RuntimeError(f"a stream of round {tag} ended inside the timed steps")
    engine.abort_request(ids)
    while engine.has_unfinished_requests():
        engine.step()
    return {"median_step_s": statistics.median(times), "mask_s_per_step": (clock.seconds - mask_start) / steps}


def measure(model: str, streams: int, steps: int, repeats: int, max_length: int | None) -> dict:
    free = SamplingParams(temperature=0, max_tokens=4 * steps, ignore_eos=True)
    constrained = SamplingParams(temperature=0, max_tokens=16 * steps,
                                 structured_outputs=StructuredOutputsParams(json=schema(steps, max_length)))
    with MaskClock() as clock, LLMEngine(EngineConfig.from_kwargs(model=model, kv_cache_memory="512MiB")) as engine:
        config = engine.config.model_config
        run_round(engine, "warm-free", free, streams, 4, clock)
        run_round(engine, "warm-json", constrained, streams, 4, clock)
        rounds: dict[str, list[dict]] = {"free": [], "json_schema": []}
        for repeat in range(repeats):
            rounds["free"].append(run_round(engine, f"free-{repeat}", free, streams, steps, clock))
            rounds["json_schema"].append(run_round(engine, f"json-{repeat}", constrained, streams, steps, clock))
    tpot = {kind: statistics.median(r["median_step_s"] for r in runs) for kind, runs in rounds.items()}
    return {"model": model, "string_max_length": max_length, "quantization": config.quantization or "default",
            "dtype": str(config.dtype), "streams": streams,
            "timed_steps": steps, "repeats": repeats,
            "tpot_ms": {kind: round(1000 * value, 2) for kind, value in tpot.items()},
            "tpot_ratio": round(tpot["json_schema"] / tpot["free"], 3),
            "mask_ms_per_step": round(1000 * statistics.median(r["mask_s_per_step"] for r in rounds["json_schema"]), 3),
            "rounds": rounds}


def write_markdown(path: Path, result: dict) -> None:
    machine = result["machine"]
    lines = [f"# grammar_cost, {result['date']}, {cpu_kind(machine)}", "",
             f"CPU: {machine.get('cpu_model')} x{machine.get('num_cpus')}, ISA {machine.get('isa')}, "
             f"flags {' '.join(machine.get('cpu_flags') or [])}; torch {machine.get('torch')}; jido {result['commit']}.",
             "", "| model | quantization, dtype | strings' maxLength | streams | TPOT free (ms) | TPOT json_schema (ms) | "
             "ratio | masks per step (ms) |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for run in result["runs"]:
        lines.append(f"| {run['model']} | {run['quantization']}, {run['dtype']} | {run['string_max_length'] or 'none'} | "
                     f"{run['streams']} | "
                     f"{run['tpot_ms']['free']} | {run['tpot_ms']['json_schema']} | {run['tpot_ratio']}x | "
                     f"{run['mask_ms_per_step']} |")
    lines += ["", f"Medians of {result['runs'][0]['repeats']} alternating rounds of "
              f"{result['runs'][0]['timed_steps']} steps each; `benchmarks/grammar_cost.py`."]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gemma-3-270m", "qwen2.5-coder-0.5b-instruct"])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-lengths", type=int, nargs="+", default=[0, 12],
                        help="the strings' maxLength per run (0: none); a bound leaves llguidance's fast path")
    parser.add_argument("--commit", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = []
    for model in args.models:
        for max_length in args.max_lengths:
            runs.append(measure(model, args.streams, args.steps, args.repeats, max_length or None))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "rounds"}), flush=True)
    out = args.out or Path(__file__).parent / "results" / f"grammar_cost-{now_iso()[:10]}-{cpu_kind()}.json"
    result = {"date": now_iso(), "machine": machine_info(), "commit": args.commit, "runs": runs}
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    write_markdown(out.with_suffix(".md"), result)
    print(out)


if __name__ == "__main__":
    main()
