"""How long a long prompt stalls running streams: the worst gap between two tokens of decoding requests while
a long prompt is prefilled beside them (issue 56's head-of-line finding).

The default model (default quantization and dtype) decodes ``--streams`` requests; once each has its first
token, a prompt of ``--prompt-len`` random token ids arrives. Every engine step until that prompt's first token
gives each stream one token, so the step's wall time is the streams' inter-token gap. Reports the largest and
median such step, the steps' count and the long prompt's time to first token, for each value of
``--while-decoding`` (the scheduler's max_num_prefill_tokens_while_decoding; 0: no cap, as before it existed).
Run alone, under the lock:

    flock /tmp/jido-bench.lock env PYTHONPATH=. .venv/bin/python benchmarks/prefill_stall.py \\
        [--prompt-len 16384] [--streams 8] [--while-decoding 0 512] \\
        [--out benchmarks/results/prefill_stall-<date>-<cpu kind>.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from jido.bench.machine import machine_info, now_iso
from jido.config import EngineConfig
from jido.core.sampling_params import SamplingParams
from jido.engine.llm_engine import LLMEngine


def measure(prompt_len: int, num_streams: int, while_decoding: int) -> dict:
    cap = {} if while_decoding == 0 else {"max_num_prefill_tokens_while_decoding": while_decoding}
    # No cap at all: a value past max_num_batched_tokens changes nothing.
    cap = cap or {"max_num_prefill_tokens_while_decoding": 2**31 - 1}
    engine = LLMEngine(EngineConfig.from_kwargs(kv_cache_memory="1GiB", max_model_len=prompt_len + 64, **cap))
    try:
        gen = torch.Generator().manual_seed(0)
        decode = SamplingParams(max_tokens=prompt_len, ignore_eos=True, temperature=0)
        for i in range(num_streams):
            engine.add_request(f"stream-{i}", [2, *torch.randint(1000, 200000, (16,), generator=gen).tolist()], decode)
        started: set[str] = set()
        while len(started) < num_streams:
            started |= {o.request_id for o in engine.step() if o.outputs[0].token_ids}
        engine.add_request("long", [2, *torch.randint(1000, 200000, (prompt_len - 1,), generator=gen).tolist()],
                           SamplingParams(max_tokens=1, temperature=0))
        arrival, steps = time.perf_counter(), []
        while True:
            start = time.perf_counter()
            outputs = engine.step()
            steps.append(time.perf_counter() - start)
            if any(o.request_id == "long" and o.finished for o in outputs):
                break
        return {"while_decoding": while_decoding, "prompt_len": prompt_len, "streams": num_streams,
                "worst_gap_s": round(max(steps), 3), "median_gap_s": round(statistics.median(steps), 3),
                "steps": len(steps), "long_prompt_ttft_s": round(time.perf_counter() - arrival, 2)}
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-len", type=int, default=16384)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--while-decoding", type=int, nargs="+", default=[0, 512])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = []
    for value in args.while_decoding:
        runs.append(measure(args.prompt_len, args.streams, value))
        print(json.dumps(runs[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"date": now_iso(), "machine": machine_info(), "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
