"""What tensor and pipeline parallelism cost on this machine: decode steps of the default model (Gemma 3 270M)
in one process against TP=2 and PP=2 in the same run, each step split into compute and communication.

Every configuration uses all cores (one process with all of them; two ranks with half each). The engine
prefills ``--batch`` prompts of ``--context`` tokens, then runs ``--steps`` decode steps; the workers' own
counters (``Worker.parallel_stats``) give each step's seconds, the seconds inside collectives, and the
all-reduces and bytes per step; a pipeline stage's idle share of its step is its bubble, compared with
(p - 1) / (m + p - 1). Configurations run interleaved, ``--repeats`` rounds; figures are medians over rounds.
``--calibration-out FILE`` writes the TP all-reduce samples in the form ``jido plan --calibrate`` reads.

    flock /tmp/jido-bench.lock .venv/bin/python benchmarks/parallel_step.py --repeats 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from jido import LLM, SamplingParams
from jido.bench.machine import cpu_kind, machine_info, now_iso

RESULTS = Path(__file__).parent / "results"
CONFIGS = {
    "single": {"distributed_executor_backend": "mp"},
    "tp2": {"tensor_parallel_size": 2},
    "pp2-m2": {"pipeline_parallel_size": 2, "pipeline_micro_batches": 2},
    "pp2-m4": {"pipeline_parallel_size": 2, "pipeline_micro_batches": 4},
}


def run_round(llm: LLM, batch: int, context: int, steps: int) -> dict:
    """One round's per-step figures: prefill untimed, then ``steps`` decode steps counted by the workers."""
    prompts = [[2] + [1000 + (i * 7919 + j * 31) % 200000 for j in range(context - 1)] for i in range(batch)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)  # warm the shapes
    llm.reset_prefix_cache()
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{time.perf_counter_ns()}-{i}", prompt, params)
    engine.step()  # the prefill step
    llm.collective_rpc("parallel_stats", kwargs={"reset": True})
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    wall = time.perf_counter() - start
    return summarize(llm.collective_rpc("parallel_stats"), wall)


def summarize(stats: list[dict], wall_s: float) -> dict:
    num_steps = stats[0]["num_steps"]
    out = {"num_steps": num_steps, "engine_step_ms": 1e3 * wall_s / num_steps, "ranks": []}
    for rank in stats:
        tp, pp = rank["tp"], rank["pp"]
        comm_s = tp["seconds"] + (pp["seconds"] if pp is not tp else 0.0)
        row = {"step_ms": 1e3 * rank["step_s"] / num_steps, "comm_ms": 1e3 * comm_s / num_steps,
               "all_reduces_per_step": tp["calls"].get("all_reduce", 0) / num_steps,
               "all_reduce_bytes_per_step": tp["bytes"].get("all_reduce", 0) / num_steps,
               "all_gathers_per_step": tp["calls"].get("all_gather", 0) / num_steps,
               "pp_calls_per_step": {k: v / num_steps for k, v in pp["calls"].items()} if pp is not tp else {}}
        row["compute_ms"] = row["step_ms"] - row["comm_ms"]
        if rank["busy_s"] is not None:
            row["busy_ms"] = 1e3 * rank["busy_s"] / num_steps
            row["bubble"] = 1 - rank["busy_s"] / rank["step_s"]
        out["ranks"].append(row)
    return out


def median_rounds(rounds: list[dict]) -> dict:
    """Each numeric figure's median over rounds (rank by rank)."""
    def med(values: list) -> object:
        return statistics.median(values) if isinstance(values[0], (int, float)) else values[0]

    merged = {k: med([r[k] for r in rounds]) for k in rounds[0] if k != "ranks"}
    merged["ranks"] = [{k: med([r["ranks"][i][k] for r in rounds]) for k in rounds[0]["ranks"][i]}
                       for i in range(len(rounds[0]["ranks"]))]
    return merged


def calibration_samples(llm: LLM, batches: list[int]) -> list[dict]:
    """(bytes, seconds) per all-reduce of TP rank 0 at several batch sizes, for ``jido plan --calibrate``."""
    samples = []
    for batch in batches:
        result = run_round(llm, batch, 64, 8)
        rank = result["ranks"][0]
        per_call_s = 1e-3 * rank["comm_ms"] / (rank["all_reduces_per_step"] + rank["all_gathers_per_step"])
        samples.append({"bytes": rank["all_reduce_bytes_per_step"] / rank["all_reduces_per_step"],
                        "seconds": per_call_s, "batch": batch})
    return samples


def planner_figures(batch: int, context: int, calibration_file: Path | None) -> dict:
    """What the planner predicts for the same model, batch and degree on cpu-2core (calibrated if a file is given):
    its decode step at TP1 and TP2, and TP2's all-reduces, bytes and seconds per step."""
    from jido.planner.calibration import apply_calibration, read_calibration
    from jido.planner.catalog import load_catalog
    from jido.planner.model_shapes import load_model
    from jido.planner.parallelism import tp_all_reduces_per_token
    from jido.planner.roofline import ACTIVATION_BYTES, Instance, Role, StepBatch

    catalog = load_catalog()
    if calibration_file is not None:
        catalog = apply_calibration(catalog, read_calibration(calibration_file))
    model, cpu = load_model("gemma-3-270m"), catalog.accelerator("cpu-2core")
    out = {"tp_link_gb_s": cpu.tp_link_gb_s, "tp_latency_us": cpu.tp_latency_us, "max_tp": cpu.max_tp}
    for tp in (1, 2):
        if tp > cpu.max_tp:
            out[f"tp{tp}"] = "refused: cpu-2core has no TP link in the catalog (max_tp 1)"
            continue
        instance = Instance(model, Role("cpu-2core"), cpu, catalog.residency("hbm"), catalog.efficiency, tp)
        cost = instance.step(StepBatch.decode(batch, context))
        out[f"tp{tp}"] = {"step_ms": 1e3 * cost.time_s, "comm_ms": 1e3 * cost.comm_s,
                          "all_reduces_per_step": tp_all_reduces_per_token(model.num_layers, tp),
                          "bytes_per_all_reduce": batch * model.hidden_size * ACTIVATION_BYTES}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--calibration-out", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / f"parallel_step-{now_iso()[:10]}-{cpu_kind()}.json")
    parser.add_argument("--planner-only", type=Path, metavar="RESULT.json",
                        help="add the planner's figures (uncalibrated, and with --calibration-file) to a result")
    parser.add_argument("--calibration-file", type=Path, default=None)
    args = parser.parse_args()
    if args.planner_only is not None:
        record = json.loads(args.planner_only.read_text())
        record["planner"] = {"uncalibrated": planner_figures(record["batch"], record["context"], None)}
        if args.calibration_file is not None:
            record["planner"]["calibrated"] = planner_figures(record["batch"], record["context"],
                                                              args.calibration_file)
        args.planner_only.write_text(json.dumps(record, indent=2) + "\n")
        print(json.dumps(record["planner"], indent=2))
        return
    llms = {name: LLM(dtype=args.dtype, kv_cache_memory="256MiB", enable_prefix_caching=False, **CONFIGS[name])
            for name in args.configs}
    rounds: dict[str, list[dict]] = {name: [] for name in llms}
    for _ in range(args.repeats):
        for name, llm in llms.items():
            rounds[name].append(run_round(llm, args.batch, args.context, args.steps))
    results = {name: median_rounds(r) for name, r in rounds.items()}
    record = {"date": now_iso(), "machine": machine_info(), "model": "gemma-3-270m (Q4_K_M, gguf codes)",
              "dtype": args.dtype, "batch": args.batch, "context": args.context, "steps": args.steps,
              "repeats": args.repeats, "results": results}
    if args.calibration_out is not None and "tp2" in llms:
        record["calibration"] = calibration_samples(llms["tp2"], [1, 8, 32])
        args.calibration_out.write_text(json.dumps({"accelerator": "cpu-2core", "tp": 2,
                                                    "samples": record["calibration"]}, indent=2) + "\n")
    for llm in llms.values():
        llm.shutdown()
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
