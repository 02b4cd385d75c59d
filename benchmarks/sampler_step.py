"""Sampler step: host time to patch the per-step sampling state and to sample, old per-row sampler vs batched.

128 rows over Gemma 3's 262,144-entry vocabulary, each row with a ~512-token prompt and 64 output
tokens, in four settings: greedy; temperature 0.8 / top-k 50 / top-p 0.95 ("random"); the same with
repetition, presence and frequency penalties on every row; the same with a seed on every row.
(a) patch: old, the runner's per-step SamplingRow lists (prompt and output copied); new,
``SamplingBatch.append_tokens`` for the last step's tokens plus ``metadata(slots)``.
(b) sample: ``Sampler.sample`` on a fresh copy of the logits. Medians of ``--repeats`` runs, in ms.

    PYTHONPATH=. .venv/bin/python benchmarks/sampler_step.py [--repeats 3] [--rows 128] [--vocab 262144]
"""
from __future__ import annotations

import argparse
import sys
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from jido.core.outputs import Logprobs
from jido.core.sampling_params import SamplingParams
from jido.sampling.batch import SamplingBatch
from jido.sampling.sampler import Sampler

# The per-row filters of the old sampler live once, in the tests' reference; the benchmark times them.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "sampling"))
from reference_sampler import Row, reference_filtered_probs, reference_penalties  # noqa: E402

_SEED_MIX = 0x9E3779B97F4A7C15
PROMPT_LEN, OUTPUT_LEN = 512, 64
RANDOM = {"temperature": 0.8, "top_k": 50, "top_p": 0.95}
SETTINGS = {
    "greedy": {"temperature": 0.0},
    "random": RANDOM,
    "penalties": {**RANDOM, "repetition_penalty": 1.1, "presence_penalty": 0.3, "frequency_penalty": 0.3},
    "seeded": {**RANDOM, "seed": 1234},
}


# --- The per-row sampler this benchmark measures against (jido/sampling/sampler.py before batching) ---



class OldSampler:
    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)

    def sample(self, logits: torch.Tensor, rows: list[Row]) -> tuple[list[int], list[Logprobs | None]]:
        logits = self._apply_constraints(logits, rows)
        token_ids = logits.argmax(dim=-1).tolist()
        for i, row in enumerate(rows):
            if not row.params.is_greedy:
                token_ids[i] = self._sample_row(logits[i], row)
        return token_ids, [None] * len(rows)

    def _apply_constraints(self, logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
        needs = [i for i, r in enumerate(rows) if r.params.needs_penalties]
        if not needs:
            return logits
        logits = logits.clone()
        for i in needs:
            reference_penalties(logits[i], rows[i].params, rows[i].prompt_token_ids, rows[i].output_token_ids)
        return logits

    def _sample_row(self, logits: torch.Tensor, row: Row) -> int:
        probs = reference_filtered_probs(logits, row.params)
        generator = self.generator
        if row.params.seed is not None:
            generator = torch.Generator(logits.device)
            generator.manual_seed((row.params.seed * _SEED_MIX + len(row.output_token_ids)) % (2**63))
        noise = torch.empty_like(probs).exponential_(generator=generator)
        return int((probs / noise).argmax())


# --- Measurement ---

def median_ms(fn: Callable[[], object], setup: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        arg = setup()
        start = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run_setting(name: str, num_rows: int, vocab: int, repeats: int) -> dict[str, float]:
    params = SamplingParams(max_tokens=None, **SETTINGS[name])
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, vocab, (PROMPT_LEN + OUTPUT_LEN,), generator=gen).tolist() for _ in range(num_rows)]
    logits = torch.randn(num_rows, vocab, generator=gen) * 4
    slots, new_tokens = list(range(num_rows)), torch.randint(0, vocab, (num_rows,), generator=gen)
    batch = SamplingBatch(num_rows, vocab)
    for slot, ids in enumerate(tokens):
        batch.add_request(slot, params, ids[:PROMPT_LEN], ids[PROMPT_LEN:], (1,))
    old_rows = [Row(params, ids[:PROMPT_LEN], ids[PROMPT_LEN:], (1,)) for ids in tokens]
    old, new = OldSampler(0), Sampler(0)

    def new_patch(_: object) -> object:
        batch.append_tokens(slots, new_tokens)
        return batch.metadata(slots)

    metadata = new_patch(None)
    return {
        "old patch": median_ms(lambda _: [Row(params, ids[:PROMPT_LEN], ids[PROMPT_LEN:], (1,)) for ids in tokens],
                               lambda: None, repeats),
        "new patch": median_ms(new_patch, lambda: None, repeats),
        "old sample": median_ms(lambda x: old.sample(x, old_rows), logits.clone, repeats),
        "new sample": median_ms(lambda x: new.sample(x, metadata), logits.clone, repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=262144)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rows} rows x {args.vocab} vocab, "
          f"median of {args.repeats} runs, ms")
    print(f"{'setting':<10} {'old patch':>10} {'new patch':>10} {'old sample':>11} {'new sample':>11} {'speed-up':>9}")
    for name in SETTINGS:
        r = run_setting(name, args.rows, args.vocab, args.repeats)
        total_old, total_new = r["old patch"] + r["old sample"], r["new patch"] + r["new sample"]
        print(f"{name:<10} {r['old patch']:>10.2f} {r['new patch']:>10.2f} {r['old sample']:>11.1f} "
              f"{r['new sample']:>11.1f} {total_old / total_new:>8.1f}x")


if __name__ == "__main__":
    main()
