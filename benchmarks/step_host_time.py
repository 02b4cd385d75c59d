"""Host time per decode step: the Python and numpy work around the model, before and after the persistent batch.

128 running requests at 2k context (Gemma 3 270M's KV groups: one full, five 512-token windows; vocab
262,144), decoding one token each per step, no model: the logits are not computed, so what is timed is
the host work a step adds to the model's — exactly what the core-seams issue bounds.

- before: the runner as of commit ae06325 (copied below as the baseline): per-request token lists,
  ``update_states`` + ``build_inputs`` + one ``sampling_row()`` per request (prompt and output copied).
- after: ``InputBatch.update`` + ``prepare_inputs`` + ``SamplingBatch.metadata`` + ``append_sampled``.
The scheduler's ``schedule`` and ``update_from_output`` (after only; the same for both runners) are
reported too, and the mp executor's transport: one decode step's ``SchedulerOutput`` sent over a pipe to
a spawned process that answers with a ``ModelRunnerOutput`` of 128 tokens (pickling both ways).
Medians over ``--steps`` steps, ``--repeats`` times.

    .venv/bin/python benchmarks/step_host_time.py [--steps 50] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from jido.core.kv_cache_manager import KVCacheManager
from jido.core.outputs import ModelRunnerOutput, SchedulerOutput
from jido.core.request import Request
from jido.core.sampling_params import SamplingParams
from jido.core.scheduler import Scheduler, SchedulerLimits
from jido.runner.input_batch import InputBatch

NUM_REQS, CONTEXT, BLOCK, VOCAB = 128, 2048, 16, 262_144
WINDOWS = (None, 512, 512, 512, 512, 512)
PENALTIES = SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True, repetition_penalty=1.1,
                           presence_penalty=0.2, frequency_penalty=0.1)
PLAIN = SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True)


# -- the baseline: the runner's host path as of ae06325 ----------------------------------------------
@dataclass
class _OldState:
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int

    def sampling_row(self) -> tuple:
        return (self.params, self.token_ids[:self.num_prompt_tokens], self.token_ids[self.num_prompt_tokens:])


def _old_step(states: dict[str, _OldState], sched: SchedulerOutput, sampled: list[int]) -> None:
    for cached in sched.scheduled_cached_reqs:
        state = states[cached.req_id]
        state.block_ids.extend(cached.new_block_ids[0])
        state.num_computed_tokens = cached.num_computed_tokens
    req_ids = list(sched.num_scheduled_tokens)
    query_lens = [sched.num_scheduled_tokens[r] for r in req_ids]
    starts = [states[r].num_computed_tokens for r in req_ids]
    seq_lens = [s + n for s, n in zip(starts, query_lens)]
    input_ids = np.concatenate([np.asarray(states[r].token_ids[s:e], dtype=np.int64)
                                for r, s, e in zip(req_ids, starts, seq_lens)])
    positions = np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in zip(starts, seq_lens)])
    width = max(len(states[r].block_ids) for r in req_ids)
    table = np.zeros((len(req_ids), width), dtype=np.int32)
    for i, r in enumerate(req_ids):
        table[i, :len(states[r].block_ids)] = states[r].block_ids
    req_index = np.repeat(np.arange(len(req_ids)), query_lens)
    slots = table[req_index, positions // BLOCK].astype(np.int64) * BLOCK + positions % BLOCK
    torch.from_numpy(input_ids), torch.from_numpy(positions), torch.from_numpy(slots), torch.from_numpy(table)
    rows = [states[r].sampling_row() for r in req_ids]
    for state in states.values():  # the runner advanced its own counter too
        state.num_computed_tokens += 1
    for r, token in zip(req_ids, sampled):
        states[r].token_ids.append(token)
    del rows


# -- the engine's own path ------------------------------------------------------------------------
def _running_scheduler(params: SamplingParams) -> tuple[Scheduler, InputBatch, dict[str, _OldState]]:
    """128 requests whose 2048-token prompts are computed (no model runs), ready to decode."""
    num_blocks = NUM_REQS * len(WINDOWS) * (CONTEXT // BLOCK + 1)  # the whole prompts at once, before windows slide
    kv = KVCacheManager(num_blocks, BLOCK, enable_caching=True, sliding_windows=WINDOWS)
    scheduler = Scheduler(SchedulerLimits(NUM_REQS, NUM_REQS * CONTEXT, 32768), kv)
    rng = random.Random(0)
    for i in range(NUM_REQS):
        scheduler.add_request(Request(str(i), [rng.randrange(VOCAB) for _ in range(CONTEXT)], params))
    batch = InputBatch(NUM_REQS, len(WINDOWS), BLOCK, VOCAB, torch.device("cpu"))
    sched = scheduler.schedule()
    batch.update(sched)
    old = {n.req_id: _OldState(list(n.token_ids), n.num_prompt_tokens, n.sampling_params, list(n.block_ids[0]),
                               n.num_computed_tokens + len(n.token_ids)) for n in sched.scheduled_new_reqs}
    first = {r: [1] for r in sched.num_scheduled_tokens}
    rows = np.array([batch.req_index[r] for r in first])
    batch.append_sampled(rows, [[1]] * len(rows))
    for state in old.values():
        state.token_ids.append(1)
    scheduler.update_from_output(sched, ModelRunnerOutput(first))
    return scheduler, batch, old


def time_steps(params: SamplingParams, steps: int) -> dict[str, float]:
    scheduler, batch, old = _running_scheduler(params)
    phases: dict[str, list[float]] = {"schedule": [], "runner_before": [], "runner_after": [], "update": []}
    for step in range(steps):
        token = 2 + step % 1000
        t0 = time.perf_counter()
        sched = scheduler.schedule()
        t1 = time.perf_counter()
        batch.update(sched)
        inputs = batch.prepare_inputs(sched)
        batch.sampling.metadata(inputs.sampled_rows.tolist())
        batch.append_sampled(inputs.sampled_rows, [[token]] * len(inputs.sampled_rows))
        t2 = time.perf_counter()
        _old_step(old, sched, [token] * len(inputs.sampled_rows))
        t3 = time.perf_counter()
        scheduler.update_from_output(sched, ModelRunnerOutput({r: [token] for r in inputs.sampled_req_ids}))
        t4 = time.perf_counter()
        for name, seconds in zip(phases, (t1 - t0, t3 - t2, t2 - t1, t4 - t3)):
            phases[name].append(seconds * 1e3)
    return {f"{name}_ms": statistics.median(values) for name, values in phases.items()}


def _echo(conn) -> None:
    """A stand-in worker: answers each step with one token per scheduled request."""
    while (sched := conn.recv()) is not None:
        conn.send(ModelRunnerOutput({r: [1] for r in sched.num_scheduled_tokens}))


def time_pipe_round_trip(steps: int) -> float:
    scheduler, _, _ = _running_scheduler(PLAIN)
    sched = scheduler.schedule()
    context = mp.get_context("spawn")
    parent, child = context.Pipe()
    worker = context.Process(target=_echo, args=(child,), daemon=True)
    worker.start()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        parent.send(sched)
        parent.recv()
        times.append((time.perf_counter() - start) * 1e3)
    parent.send(None)
    worker.join()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = {}
    for name, params in (("no_penalties", PLAIN), ("penalties", PENALTIES)):
        runs = [time_steps(params, args.steps) for _ in range(args.repeats)]
        results[name] = {key: round(statistics.median(r[key] for r in runs), 3) for key in runs[0]}
    results["mp_pipe_round_trip_ms"] = round(time_pipe_round_trip(args.steps), 3)
    print(json.dumps({"num_requests": NUM_REQS, "context": CONTEXT, "steps": args.steps, "repeats": args.repeats,
                      "torch_threads": torch.get_num_threads(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
