"""Workloads: prompts cut from real text with lengths drawn for a seed (random, conversation, ...)."""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jido.bench.config import BenchConfig
from jido.bench.corpus import Corpus
from jido.bench.tokens import count_tokens

# ShareGPT-like chat lengths. The means are those the vLLM paper reports for ShareGPT (Kwon et al.,
# "Efficient Memory Management for LLM Serving with PagedAttention", SOSP 2023, Fig. 11: 161 input and
# 338 output tokens on average). The lognormal shapes (sigma) are ours, chosen for the long right tail of
# that figure; they are not a fit. Lengths outside vLLM's ShareGPT filter (prompt 4..1024 tokens,
# output >= 4, prompt + output <= 2048) are redrawn, as vLLM drops such conversations.
CONVERSATION_INPUT_MEAN, CONVERSATION_INPUT_SIGMA = 161.0, 1.0
CONVERSATION_OUTPUT_MEAN, CONVERSATION_OUTPUT_SIGMA = 338.0, 0.8
CONVERSATION_MIN_LEN, CONVERSATION_MAX_INPUT, CONVERSATION_MAX_TOTAL = 4, 1024, 2048

_QUESTIONS = (
    'In the document above, what does this passage mean: "{quote}"?',
    'Where does the document above mention "{quote}", and why does it matter?',
    'Explain, with an example, the rule behind "{quote}" in the document above.',
)
# Input-grounded prompts: a passage to write out again with a small change, so most of the answer copies the
# prompt, as in code and document editing (where prompt-lookup speculation pays). They read as text to
# continue for a base model and as an instruction for a chat model.
_REWRITE_TEMPLATES = (
    "Rewrite the passage below word for word, correcting only its punctuation.\n\nPassage:\n{passage}\n\n"
    "Rewritten passage:\n",
    "Below is a section of the Python documentation, then the same section copied out again with every "
    "example kept.\n\nOriginal:\n{passage}\n\nCopy:\n",
)
_CHAT_OPENERS = ("Can you explain this to me?", "Summarize the following.", "What is wrong with this?",
                 "Rewrite this more simply.", "Answer the question this raises.")


@dataclass(frozen=True)
class SampleRequest:
    """One prompt and how many tokens to ask for."""

    prompt: str
    prompt_len: int
    output_len: int


def sample_requests(config: BenchConfig, corpus: Corpus) -> list[SampleRequest]:
    """config.num_prompts requests of config.dataset_name, the same ones for the same seed."""
    rng = np.random.default_rng(config.seed)
    return _DATASETS[config.dataset_name](config, corpus, rng)


def uniform_lengths(mean: int, range_ratio: float, num: int, rng: np.random.Generator) -> np.ndarray:
    """Integers uniform in [mean * (1 - r), mean * (1 + r)], at least 1, as vLLM's random dataset."""
    low, high = max(1, math.floor(mean * (1 - range_ratio))), math.ceil(mean * (1 + range_ratio))
    return rng.integers(low, high + 1, size=num)


def _random(config: BenchConfig, corpus: Corpus, rng: np.random.Generator) -> list[SampleRequest]:
    input_lens = uniform_lengths(config.random_input_len, config.random_range_ratio, config.num_prompts, rng)
    output_lens = uniform_lengths(config.random_output_len, config.random_range_ratio, config.num_prompts, rng)
    starts = rng.integers(0, corpus.num_tokens, size=config.num_prompts)
    return [_request(corpus, corpus.window(int(s), int(n)), int(o)) for s, n, o in zip(starts, input_lens, output_lens)]


def conversation_lengths(num: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """(input, output) token lengths from the ShareGPT-like lognormals above, filtered like vLLM."""
    lengths: list[tuple[int, int]] = []
    while len(lengths) < num:
        prompt_len = round(_lognormal(rng, CONVERSATION_INPUT_MEAN, CONVERSATION_INPUT_SIGMA))
        output_len = round(_lognormal(rng, CONVERSATION_OUTPUT_MEAN, CONVERSATION_OUTPUT_SIGMA))
        if (CONVERSATION_MIN_LEN <= prompt_len <= CONVERSATION_MAX_INPUT and output_len >= CONVERSATION_MIN_LEN
                and prompt_len + output_len <= CONVERSATION_MAX_TOTAL):
            lengths.append((prompt_len, output_len))
    return lengths


def _lognormal(rng: np.random.Generator, mean: float, sigma: float) -> float:
    # A lognormal's mean is exp(mu + sigma^2 / 2); solve for mu so the mean is the one quoted.
    return float(rng.lognormal(math.log(mean) - sigma**2 / 2, sigma))


def _conversation(config: BenchConfig, corpus: Corpus, rng: np.random.Generator) -> list[SampleRequest]:
    requests = []
    for prompt_len, output_len in conversation_lengths(config.num_prompts, rng):
        opener = _CHAT_OPENERS[int(rng.integers(len(_CHAT_OPENERS)))]
        body_len = max(1, prompt_len - count_tokens(corpus.counter, opener))
        body = corpus.window(int(rng.integers(corpus.num_tokens)), body_len)
        requests.append(_request(corpus, f"{opener}\n\n{body}", output_len))
    return requests


def _shared_prefix(config: BenchConfig, corpus: Corpus, rng: np.random.Generator) -> list[SampleRequest]:
    prefixes = _distinct_windows(corpus, config.num_prefixes, config.prefix_len, rng)
    suffix_lens = uniform_lengths(config.random_input_len, config.random_range_ratio, config.num_prompts, rng)
    output_lens = uniform_lengths(config.random_output_len, config.random_range_ratio, config.num_prompts, rng)
    requests = []
    for i, (suffix_len, output_len) in enumerate(zip(suffix_lens, output_lens)):
        suffix = corpus.window(int(rng.integers(corpus.num_tokens)), int(suffix_len))
        requests.append(_request(corpus, f"{prefixes[i % len(prefixes)]}\n\n{suffix}", int(output_len)))
    return [requests[i] for i in rng.permutation(len(requests))]


def _long_doc_qa(config: BenchConfig, corpus: Corpus, rng: np.random.Generator) -> list[SampleRequest]:
    documents = [Corpus(text, corpus.counter)
                 for text in _distinct_windows(corpus, config.num_documents, config.document_len, rng)]
    output_lens = uniform_lengths(config.random_output_len, config.random_range_ratio, config.num_prompts, rng)
    requests = []
    for i, output_len in enumerate(output_lens):
        document = documents[i % len(documents)]
        quote = document.window(int(rng.integers(document.num_tokens)), 8).replace("\n", " ")
        question = _QUESTIONS[int(rng.integers(len(_QUESTIONS)))].format(quote=quote)
        requests.append(_request(corpus, f"{document.text}\n\nQuestion: {question}", int(output_len)))
    return [requests[i] for i in rng.permutation(len(requests))]


def _mixed(config: BenchConfig, corpus: Corpus, rng: np.random.Generator) -> list[SampleRequest]:
    """Short prompts that decode long, with long prompts among them: the long ones' prefills arrive while the
    short ones' streams decode (prefill/decode interference). Long ones sit at random places in the order."""
    num_long = round(config.num_prompts * config.mixed_long_fraction)
    is_long = np.zeros(config.num_prompts, dtype=bool)
    is_long[rng.permutation(config.num_prompts)[:num_long]] = True
    short_lens = uniform_lengths(config.random_input_len, config.random_range_ratio, config.num_prompts, rng)
    output_lens = uniform_lengths(config.random_output_len, config.random_range_ratio, config.num_prompts, rng)
    starts = rng.integers(0, corpus.num_tokens, size=config.num_prompts)
    return [_request(corpus, corpus.window(int(s), config.mixed_long_len if long else int(n)),
                     config.mixed_long_output_len if long else int(o))
            for s, n, o, long in zip(starts, short_lens, output_lens, is_long)]


def _rewrite(config: BenchConfig, corpus: Corpus, rng: np.random.Generator) -> list[SampleRequest]:
    """A passage of about --random-input-len tokens to reproduce; --random-output-len tokens asked for."""
    passage_lens = uniform_lengths(config.random_input_len, config.random_range_ratio, config.num_prompts, rng)
    output_lens = uniform_lengths(config.random_output_len, config.random_range_ratio, config.num_prompts, rng)
    starts = rng.integers(0, corpus.num_tokens, size=config.num_prompts)
    templates = rng.integers(len(_REWRITE_TEMPLATES), size=config.num_prompts)
    return [_request(corpus, _REWRITE_TEMPLATES[int(t)].format(passage=corpus.window(int(s), int(n))), int(o))
            for s, n, o, t in zip(starts, passage_lens, output_lens, templates)]


def _distinct_windows(corpus: Corpus, num: int, num_tokens: int, rng: np.random.Generator) -> list[str]:
    # Evenly spaced starts with one random shift: the windows do not overlap while the corpus is long enough.
    shift = int(rng.integers(corpus.num_tokens))
    step = max(num_tokens, corpus.num_tokens // num)
    return [corpus.window(shift + i * step, num_tokens) for i in range(num)]


def _jsonl(config: BenchConfig, corpus: Corpus, rng: np.random.Generator) -> list[SampleRequest]:
    """Lines like {"prompt": "...", "output_len": 128}; output_len defaults to --random-output-len."""
    path = Path(config.dataset_path or "")
    rows = [_jsonl_row(path, number, line, config.random_output_len)
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
    if not rows:
        raise ValueError(f"{path}: no prompts; each line must be a JSON object with a 'prompt'")
    # Cycled in file order so a short file still yields num_prompts requests.
    return [_request(corpus, *rows[i % len(rows)]) for i in range(config.num_prompts)]


def _jsonl_row(path: Path, number: int, line: str, default_output_len: int) -> tuple[str, int]:
    try:
        row = json.loads(line)
        prompt, output_len = row["prompt"], int(row.get("output_len", default_output_len))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}:{number}: expected {{\"prompt\": str, \"output_len\": int}}: {exc}") from None
    if not isinstance(prompt, str) or output_len < 1:
        raise ValueError(f"{path}:{number}: 'prompt' must be text and 'output_len' a positive integer")
    return prompt, output_len


def _request(corpus: Corpus, prompt: str, output_len: int) -> SampleRequest:
    return SampleRequest(prompt, count_tokens(corpus.counter, prompt), output_len)


_DATASETS: dict[str, Callable[[BenchConfig, Corpus, np.random.Generator], list[SampleRequest]]] = {
    "random": _random, "conversation": _conversation, "shared-prefix": _shared_prefix,
    "long-doc-qa": _long_doc_qa, "mixed": _mixed, "rewrite": _rewrite, "jsonl": _jsonl,
}
