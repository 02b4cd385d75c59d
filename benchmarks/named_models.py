"""Named models in jido: load time, resident memory, and batch-1 and 16-stream speed, one process per model.

(a) load: `LLM(model=name)` with the GGUF already assembled and converted (the first-time assembly and
    conversion are timed apart, once, when they happen); RSS after loading, and the process's peak RSS.
(b) batch 1: one 128-token prompt, 128 greedy tokens (EOS ignored): TTFT and decode tokens/s.
(c) 16 streams: 16 prompts of 256 tokens submitted together, 128 greedy tokens each: output tokens/s.
Prompts are windows of the standard library's documentation (offline_throughput.py's corpus). Figures are
the median of ``--repeats`` runs. Hold the machine lock while measuring:

    flock /tmp/jido-bench.lock .venv/bin/python benchmarks/named_models.py --models qwen2.5-coder-0.5b-instruct
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
PROMPT_LEN, OUTPUT_LEN, NUM_STREAMS = 128, 128, 16


def rss_gib() -> dict[str, float]:
    """This process's resident memory now (VmRSS) and at its peak (VmHWM), in GiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {key: int(fields[name].split()[0]) / 2**20 for key, name in (("rss_gib", "VmRSS"), ("peak_rss_gib", "VmHWM"))}


def measure_one(model: str, dtype: str, repeats: int) -> dict:
    """Runs in a fresh process: load, then the batch-1 and 16-stream runs."""
    from offline_throughput import AttentionTimer, corpus_token_ids, make_prompts, median_run, run_jido

    import torch

    from jido import LLM
    from jido.models.loader import resolve_model
    from jido.runner.model_loading import resolve_dtype

    start = time.perf_counter()
    resolve_model(model)  # assembles and converts on a first run; a no-op later
    prepare_s = time.perf_counter() - start
    start = time.perf_counter()
    llm = LLM(model=model, dtype=dtype, kv_cache_memory="2GiB")
    resolved = resolve_dtype(dtype, torch.device("cpu"))
    record = {"model": model, "dtype": str(resolved).removeprefix("torch."),
              "assemble_and_convert_s": prepare_s, "load_s": time.perf_counter() - start, "after_load": rss_gib()}
    timer = AttentionTimer(llm)
    ids = corpus_token_ids(llm)
    bos = llm.get_tokenizer().bos_token_id
    prompts = {"batch1": make_prompts(ids, bos, 1, PROMPT_LEN),
               f"streams{NUM_STREAMS}": make_prompts(ids[PROMPT_LEN:], bos, NUM_STREAMS, 2 * PROMPT_LEN)}
    run_jido(llm, prompts["batch1"], 8, timer)  # warm-up
    for run, run_prompts in prompts.items():
        record[run] = median_run(lambda: run_jido(llm, run_prompts, OUTPUT_LEN, timer), repeats)
    record["after_runs"] = rss_gib()
    return record


def main(argv: list[str] | None = None) -> int:
    from jido.models.named import DEFAULT_MODEL, NAMED_MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(NAMED_MODELS), help="comma-separated (default: all)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON file (default: results/named_models-<date>-<cpu kind>.json)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process: measure this model, print JSON
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one, args.dtype, args.repeats)))
        return 0
    from jido.bench.machine import cpu_kind, machine_info

    records = []
    for model in args.models.split(","):
        out = subprocess.run([sys.executable, __file__, "--one", model, "--dtype", args.dtype,
                              "--repeats", str(args.repeats)], capture_output=True, text=True, check=False)
        if out.returncode:
            raise RuntimeError(f"measuring {model} exited {out.returncode}:\n{out.stderr[-3000:]}")
        records.append(json.loads(out.stdout.splitlines()[-1]) | {"load_average_at_end": os.getloadavg()[0]})
        print(json.dumps(records[-1]), flush=True)
    import torch

    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": machine_info(), "torch": torch.__version__, "default_model": DEFAULT_MODEL,
           "settings": {"prompt_len": PROMPT_LEN, "output_len": OUTPUT_LEN, "num_streams": NUM_STREAMS,
                        "repeats": args.repeats}, "records": records}
    path = args.out or RESULTS / f"named_models-{datetime.date.today()}-{cpu_kind()}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
