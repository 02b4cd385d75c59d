"""EAGLE drafts and Medusa heads for the tiny random models, trained by `jido train-draft` in seconds on their own
continuations."""
from __future__ import annotations

from pathlib import Path

import pytest
from tiny_model_folder import VOCAB_SIZE

from jido import LLM, SamplingParams
from jido.tools.train_draft import TrainDraftConfig, train_draft

# Fewer draft rows than the vocabulary: some tokens can never be proposed, and q must still be a distribution.
DRAFT_VOCAB = 96
_CORPUS_WORDS = 4000


def write_corpus(path: Path, seed: int = 0) -> Path:
    """Words of the tiny vocabulary in a loose pattern: enough structure for a draft to learn from."""
    words = [f"w{3 + (i * 7 + (i // 13) * seed) % (VOCAB_SIZE - 3)}" for i in range(_CORPUS_WORDS)]
    path.write_text(" ".join(words))
    return path


def train_tiny_draft(target: Path, out: Path, method: str = "eagle", **overrides: object) -> tuple[Path, dict]:
    """Train a ``method`` draft for ``target`` into ``out``; the folder and what the trainer recorded."""
    settings = dict(num_prompts=40, prompt_len=16, max_tokens=24, corpus_windows=8, draft_vocab_size=DRAFT_VOCAB,
                    steps=200, batch_size=8, kv_cache_memory="16MiB", dtype="float32",
                    # Medusa's blocks start at zero and are all it trains: 200 steps at 1e-3 barely move them.
                    learning_rate=1e-2 if method == "medusa" else 1e-3)
    config = TrainDraftConfig(out=str(out / "draft"), method=method, model=str(target),
                              corpus=str(write_corpus(out / "corpus.txt")), **{**settings, **overrides})
    return out / "draft", train_draft(config)


def generate_recording_proposals(monkeypatch: pytest.MonkeyPatch, proposer_cls: type, target: Path,
                                 speculative_config: dict) -> tuple[LLM, dict[str, list[int]], list[tuple]]:
    """Three greedy requests with ``speculative_config``, 16 tokens a step (the 30-token prompt prefilled in chunks
    next to the others' decodes): the engine, each request's prompt + output, and every proposal the
    ``proposer_cls`` made as (request, tokens known when proposing, proposed ids)."""
    proposals: list[tuple[str, int, list[int]]] = []
    original = proposer_cls.propose

    def spy(self, step):
        drafts = original(self, step)
        for req_id, row, ids in zip(step.inputs.sampled_req_ids, step.inputs.sampled_rows.tolist(), drafts.token_ids):
            proposals.append((req_id, int(step.batch.num_tokens[row]), list(ids)))
        return drafts

    monkeypatch.setattr(proposer_cls, "propose", spy)
    llm = LLM(model=str(target), dtype="float32", kv_cache_memory="16MiB", max_num_batched_tokens=16,
              speculative_config=speculative_config)
    prompts = ["w5 w12 w19 w26", " ".join(f"w{3 + (i * 7) % 120}" for i in range(30)), "w40 w47 w54 w61 w68"]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)
    sequences = {o.request_id: list(o.prompt_token_ids) + list(o.outputs[0].token_ids) for o in outputs}
    return llm, sequences, proposals
