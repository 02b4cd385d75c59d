"""The parallelism tests' prompts and greedy run, in a module of its own: spawned workers unpickle references to
the test modules, and there ``conftest`` may name another folder's conftest, so tests import these from here."""
from __future__ import annotations

from jido import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8)
# Prompts of different lengths, so one step mixes prefills and decodes and splits into micro-batches.
PROMPTS = [[2, 5, 9, 17, 33, 64], [2, 40, 41], [2, 7, 7, 7, 7, 7, 7, 100, 101, 4], [2, 90]]


def greedy_tokens(llm: LLM, prompts: list = PROMPTS, params: SamplingParams = GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
