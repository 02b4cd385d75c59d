"""`jido eval perplexity`: a text file's perplexity by llama.cpp's `llama-perplexity` method, through `LLM`.

The method (llama.cpp's `tools/perplexity/perplexity.cpp`, `perplexity()`): tokenize the whole file as the
model's tokenizer does (BOS first when it adds one); cut the tokens into consecutive, non-overlapping chunks
of ``context_length`` tokens from the start, dropping the tail that does not fill a chunk; when the
tokenizer adds BOS, overwrite each chunk's first token with BOS (overwrite, not prepend: chunks stay
aligned to the file's tokens). Each chunk is run on its own, and of its positions ``0..n-1`` the tokens at
``n//2 + 1 .. n-1`` are scored: ``n - n//2 - 1`` tokens per chunk, each given every chunk token before it.
Perplexity is ``exp(mean NLL)`` over all scored tokens; its standard error is llama.cpp's
``ppl * sqrt((mean(NLL^2) - mean(NLL)^2) / (count - 1))``. llama.cpp refuses files under ``2n`` tokens;
this accepts any file holding one whole chunk.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jido.config import FLAT_CONFIGS, EngineConfig
from jido.core.sampling_params import SamplingParams
from jido.utils.cpu import cpu_info
from jido.utils.text_domains import SPLITS, RenderChat, domain_text, parse_domains, plain_transcript

if TYPE_CHECKING:  # the engine loads torch: imported by the caller that builds it
    from jido.engine.llm import LLM

# The smallest request that returns every prompt token's logprob: no top-N alternatives, no output.
SCORE_PROMPT = SamplingParams(max_tokens=0, prompt_logprobs=0)
MIN_CONTEXT_LENGTH = 3  # the shortest chunk with a token to score: n - n//2 - 1 >= 1


@dataclass(frozen=True)
class PerplexityConfig:
    """How `jido eval perplexity` cuts the text: llama-perplexity's chunks, the second half of each scored."""

    context_length: int = 512
    """Tokens per chunk, BOS included (llama-perplexity's -c); the tokens after the first half are scored."""
    max_chunks: int | None = None
    """Score at most this many chunks from the start of the file (llama-perplexity's --chunks; default: every
    whole chunk)."""
    json: bool = False
    """Print one JSON object with the engine settings and the machine instead of one line."""
    domains: str | None = None
    """Score jido's own texts instead of FILE: ``all`` or a comma-separated list of prose_en, code_python, code_c,
    chat, prose_ko, numbers_tables (one figure each; chat rendered by the model's chat template)."""
    split: str = "heldout"
    """Which set of those texts: ``heldout`` (read by no calibration or tuning) or ``calibration``."""

    def __post_init__(self) -> None:
        if self.domains is not None:
            parse_domains(self.domains)
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        if not isinstance(self.context_length, int) or self.context_length < MIN_CONTEXT_LENGTH:
            raise ValueError(f"context_length must be an integer >= {MIN_CONTEXT_LENGTH} (a chunk with at least "
                             f"one token to score), got {self.context_length!r}")
        if self.max_chunks is not None and (not isinstance(self.max_chunks, int) or self.max_chunks < 1):
            raise ValueError(f"max_chunks must be an integer >= 1, got {self.max_chunks!r}")


@dataclass(frozen=True)
class PerplexityResult:
    """One evaluation: the figure, what it was computed over, and how long the engine took."""

    perplexity: float
    stderr: float | None  # None with a single scored token
    num_scored_tokens: int
    num_chunks: int
    context_length: int
    num_text_tokens: int  # the whole file's tokens, BOS included
    wall_s: float  # the generate call alone: the model was loaded before

    @property
    def tokens_per_s(self) -> float:
        """Chunk tokens run through the model (every one, context and scored) per second."""
        return self.num_chunks * self.context_length / self.wall_s


def read_text(path: str | Path) -> str:
    """The file as UTF-8 text; ValueError when it holds nothing but whitespace."""
    text = Path(path).read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"{path} is empty: perplexity needs a text of at least one chunk of tokens")
    return text


def chunk_token_ids(token_ids: list[int], context_length: int, bos_token_id: int | None,
                    max_chunks: int | None = None) -> list[list[int]]:
    """Consecutive chunks of ``context_length`` tokens from the start (a shorter tail is dropped), each
    starting with ``bos_token_id`` in place of its own first token when one is given."""
    num_chunks = len(token_ids) // context_length
    if max_chunks is not None:
        num_chunks = min(num_chunks, max_chunks)
    chunks = [token_ids[i * context_length:(i + 1) * context_length] for i in range(num_chunks)]
    if bos_token_id is not None:
        for chunk in chunks:
            chunk[0] = bos_token_id
    return chunks


def scored_positions(context_length: int) -> range:
    """Chunk positions whose token is scored: llama.cpp reads the logits from row n//2 on, and row i predicts
    the token at i + 1; its last row (which predicts past the chunk) is not used."""
    return range(context_length // 2 + 1, context_length)


def perplexity_and_stderr(nlls: list[float]) -> tuple[float, float | None]:
    """``exp(mean NLL)`` and llama.cpp's standard error of it (None for fewer than two NLLs)."""
    count = len(nlls)
    mean = math.fsum(nlls) / count
    perplexity = math.exp(mean)
    if count < 2:
        return perplexity, None
    variance = max(0.0, math.fsum(v * v for v in nlls) / count - mean * mean)
    return perplexity, perplexity * math.sqrt(variance / (count - 1))


def evaluate(llm: LLM, text: str, config: PerplexityConfig) -> PerplexityResult:
    """Score ``text`` with ``llm``: every chunk in one ``generate`` call, so the engine batches them.

    Raises ValueError when the text has fewer tokens than one chunk, or a chunk is longer than the engine's
    ``max_model_len`` allows.
    """
    tokenizer = llm.get_tokenizer()
    token_ids = tokenizer.encode(text)
    _check_lengths(len(token_ids), config.context_length, llm.llm_engine.max_model_len)
    adds_bos = tokenizer.bos_token_id is not None and token_ids[0] == tokenizer.bos_token_id
    chunks = chunk_token_ids(token_ids, config.context_length, tokenizer.bos_token_id if adds_bos else None,
                             config.max_chunks)
    _progress(f"scoring {len(chunks)} chunks of {config.context_length} tokens ({len(token_ids)} in the file)")
    start = time.perf_counter()
    outputs = llm.generate(chunks, SCORE_PROMPT, use_tqdm=False)
    wall_s = time.perf_counter() - start
    positions = scored_positions(config.context_length)
    nlls = [-out.prompt_logprobs[p][chunk[p]].logprob for out, chunk in zip(outputs, chunks) for p in positions]
    perplexity, stderr = perplexity_and_stderr(nlls)
    return PerplexityResult(perplexity, stderr, len(nlls), len(chunks), config.context_length, len(token_ids),
                            wall_s)


def evaluate_domains(llm: LLM, config: PerplexityConfig) -> dict[str, PerplexityResult]:
    """Each of ``config.domains``' texts in ``config.split`` scored as :func:`evaluate` scores a file."""
    render = chat_renderer(llm)
    return {domain: evaluate(llm, domain_text(config.split, domain, render), config)  # type: ignore[arg-type]
            for domain in parse_domains(config.domains or "all")}


def chat_renderer(llm: LLM) -> RenderChat:
    """Whole conversations through the model's chat template (no generation prompt); a plain transcript for a model
    that has none (a base model)."""
    from jido.engine.chat_template import load_chat_template

    template = load_chat_template(llm.get_tokenizer())
    if template is None:
        return plain_transcript
    return lambda messages: template.render(messages, add_generation_prompt=False)


def _check_lengths(num_tokens: int, context_length: int, max_model_len: int) -> None:
    if num_tokens < context_length:
        raise ValueError(f"the text has {num_tokens} tokens, fewer than one chunk of context_length "
                         f"{context_length}: give a longer text or a smaller --context-length")
    # NOTE: the engine keeps room for one generated token even when none is asked for.
    if context_length >= max_model_len:
        raise ValueError(f"context_length {context_length} is above what the engine takes: max_model_len is "
                         f"{max_model_len}, so a chunk may have at most {max_model_len - 1} tokens")


def _progress(message: str) -> None:
    print(f"jido eval perplexity: {message}", file=sys.stderr, flush=True)


def result_record(result: PerplexityResult, llm: LLM) -> dict[str, Any]:
    """The result with the model, the device, dtype and attention backend it ran on (resolved where the
    settings leave them to the engine), every engine setting as given, and the machine, for ``--json``."""
    import torch  # loaded with the engine already

    from jido.attention.registry import default_attention_backend
    from jido.runner.model_loading import resolve_device, resolve_dtype

    config = llm.llm_engine.config
    device = resolve_device(config.device_config.device)
    dtype = resolve_dtype(config.model_config.dtype, device)
    backend = config.model_config.attention_backend or default_attention_backend(device.type)
    return {"model": llm.llm_engine.model_folder.name, "device": str(device),
            "dtype": str(dtype).removeprefix("torch."), "attention_backend": backend,
            **dataclasses.asdict(result), "tokens_per_s": result.tokens_per_s,
            "scored_positions": _describe_positions(result.context_length),
            "engine": engine_settings(config), "machine": {**cpu_info().as_dict(), "torch": torch.__version__}}


def engine_settings(config: EngineConfig) -> dict[str, Any]:
    """Every flat engine setting by its flag's name (settings added to the configs appear unasked)."""
    parts = [getattr(config, f.name) for f in dataclasses.fields(config)]
    return {name: value for part in parts if type(part) in FLAT_CONFIGS
            for name, value in dataclasses.asdict(part).items()}


def _describe_positions(context_length: int) -> str:
    positions = scored_positions(context_length)
    return f"{positions.start}..{positions.stop - 1} of each chunk's 0..{context_length - 1}"


def domains_record(results: dict[str, PerplexityResult], llm: LLM, split: str) -> dict[str, Any]:
    """:func:`result_record`'s settings and machine with one result per domain, for ``--json``."""
    records = {domain: result_record(result, llm) for domain, result in results.items()}
    first = next(iter(records.values()))
    shared = {k: v for k, v in first.items() if k in ("model", "device", "dtype", "attention_backend", "engine",
                                                      "machine", "context_length", "scored_positions")}
    per_domain = {domain: {k: v for k, v in record.items() if k not in shared} for domain, record in records.items()}
    return {**shared, "split": split, "domains": per_domain}


def format_result(result: PerplexityResult) -> str:
    """One line: the figure with its standard error, what it covers, and the time."""
    stderr = "" if result.stderr is None else f" ± {result.stderr:.4f}"
    return (f"perplexity {result.perplexity:.4f}{stderr} over {result.num_scored_tokens} tokens "
            f"({result.num_chunks} chunk{'' if result.num_chunks == 1 else 's'} of {result.context_length}, tokens "
            f"{_describe_positions(result.context_length)} scored); "
            f"{result.wall_s:.2f} s, {result.tokens_per_s:.1f} tokens/s")
