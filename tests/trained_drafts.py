"""EAGLE drafts and Medusa heads for the tiny random models, trained by `jido train-draft` in seconds on their own
continuations."""
from __future__ import annotations

from pathlib import Path

from tiny_model_folder import VOCAB_SIZE

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
                    steps=200, batch_size=8, kv_cache_memory="16MiB",
                    # Medusa's blocks start at zero and are all it trains: 200 steps at 1e-3 barely move them.
                    learning_rate=1e-2 if method == "medusa" else 1e-3)
    config = TrainDraftConfig(out=str(out / "draft"), method=method, model=str(target),
                              corpus=str(write_corpus(out / "corpus.txt")), **{**settings, **overrides})
    return out / "draft", train_draft(config)
