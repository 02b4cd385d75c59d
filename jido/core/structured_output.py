"""Structured outputs: requests' constraints compiled by the grammar engine (llguidance), and their token bitmasks.

llguidance was picked by measurement (``benchmarks/grammar_engines.py``, docs/structured_outputs.md): on
Gemma 3's 262,144-token vocabulary it compiles a JSON schema fastest of the three engines tried and makes a token
mask in tens of microseconds without outlines-core's slow tail, and it needs
neither torch nor transformers, so the scheduler (which must stay torch-free) owns the grammars as vLLM's
does: a mask per scheduled request per step, each accepted token advancing its grammar.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Protocol

import llguidance
import numpy as np
from llguidance.gbnf_to_lark import any_to_lark

from jido.core.sampling_params import StructuredOutputsParams
from jido.utils.shared_values import Shared, SharedValues, file_identity


def bitmask_words(vocab_size: int) -> int:
    """int32 words of one token bitmask: bit ``t % 32`` of word ``t // 32`` allows token ``t``."""
    return (vocab_size + 31) // 32


class Grammar(Protocol):
    """One request's constraint and where its output stands in it.

    Invariants: the grammar has accepted exactly the request's output tokens so far (the scheduler calls
    ``accept_token`` for each token it appends); ``fill_bitmask`` allows exactly the tokens that may come next
    (EOS once the constraint is complete and nothing else when it must end).
    """

    vocab_size: int  # the logits' width its bitmask covers

    def fill_bitmask(self, out: np.ndarray) -> None:
        """Write the next token's allowed set into ``out`` ([bitmask_words(vocab)] int32, C-contiguous)."""

    def accept_token(self, token_id: int) -> bool:
        """Advance past ``token_id``; False (the grammar then stays in an error state) when it was not allowed."""

    def is_terminated(self) -> bool:
        """Whether the constraint is finished (its stop token was accepted) or broken: nothing more may follow."""

    def validate_tokens(self, token_ids: list[int]) -> int:
        """How many of ``token_ids``, from the first, the grammar would accept in turn; advances nothing."""

    def rollback(self, num_tokens: int) -> None:
        """Take back the last ``num_tokens`` accepted tokens (each accepted while the grammar was not terminated)."""


class GuidanceGrammar:
    """A :class:`Grammar` on an llguidance matcher."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size

    def fill_bitmask(self, out: np.ndarray) -> None:
        self.matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    def accept_token(self, token_id: int) -> bool:
        return self.matcher.consume_token(token_id)

    def is_terminated(self) -> bool:
        return self.matcher.is_stopped() or self.matcher.is_error()

    def validate_tokens(self, token_ids: list[int]) -> int:
        return self.matcher.validate_tokens(token_ids)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and not self.matcher.rollback(num_tokens):
            raise RuntimeError(f"the grammar could not take back {num_tokens} tokens: {self.matcher.get_error()}")


# llguidance's tokenizers (immutable) by file and vocabulary, shared by the engines of one process that hold them.
_LLG_TOKENIZERS: SharedValues[llguidance.LLTokenizer] = SharedValues()


class GrammarCompiler:
    """Compiles ``StructuredOutputsParams`` into grammars over one model's vocabulary; safe from any thread.

    The vocabulary's token trie is built on first use (seconds for Gemma 3's 262,144 tokens), from the tokenizer
    file read then, so an engine that never sees a constraint never pays for either: Gemma 3's tokenizer.json held
    as a Python string took over 100 MiB of the server's memory. Engines of one process share one trie per file.
    """

    def __init__(self, tokenizer_file: Path, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.vocab_size = vocab_size
        self._tokenizer_file = Path(tokenizer_file)
        self._eos_token_ids = list(eos_token_ids)
        self._tokenizer: Shared[llguidance.LLTokenizer] | None = None
        self._lock = threading.Lock()

    def compile(self, params: StructuredOutputsParams) -> GuidanceGrammar:
        """A fresh grammar at the start of the output; raises ValueError naming the field when it is invalid."""
        grammar, field = grammar_text(params)
        tokenizer = self._llg_tokenizer()
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error and not error.startswith("WARNING"):
            raise ValueError(f"structured_outputs.{field} is invalid: {error.strip()}")
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"structured_outputs.{field} is invalid: {matcher.get_error()}")
        return GuidanceGrammar(matcher, self.vocab_size)

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                key = (*file_identity(self._tokenizer_file), self.vocab_size, tuple(self._eos_token_ids))
                self._tokenizer = _LLG_TOKENIZERS.get(key, self._build_llg_tokenizer)
            return self._tokenizer.value

    def _build_llg_tokenizer(self) -> llguidance.LLTokenizer:
        try:
            tokenizer_json = self._tokenizer_file.read_text(encoding="utf-8")
            return llguidance.LLTokenizer(tokenizer_json, n_vocab=self.vocab_size, eos_token=self._eos_token_ids)
        except ValueError as exc:  # e.g. a word-level vocabulary, with no byte-level decoder
            raise ValueError(f"structured_outputs needs a byte-level or byte-fallback tokenizer: {exc}") from exc


def grammar_text(params: StructuredOutputsParams) -> tuple[str, str]:
    """llguidance's grammar for ``params``, and the field it came from; raises ValueError naming the field."""
    kind = params.kinds[0]
    if kind in ("json", "json_object"):
        schema = {"type": "object"} if kind == "json_object" else params.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from exc
        if not isinstance(schema, dict):
            raise ValueError(f"structured_outputs.json must be a JSON schema object, got {type(schema).__name__}")
        options = {"whitespace_flexible": not params.disable_any_whitespace}
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options), kind
        except ValueError as exc:
            raise ValueError(f"structured_outputs.json is not a usable JSON schema: {exc}") from exc
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(params.regex), kind
    if kind == "choice":
        # Each choice a Lark string literal: JSON's escapes are Lark's.
        alternatives = " | ".join(json.dumps(choice) for choice in params.choice)
        return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}"), kind
    try:
        return llguidance.LLMatcher.grammar_from_lark(any_to_lark(params.grammar)), kind
    except Exception as exc:  # the GBNF converter raises its own errors for text it cannot read
        raise ValueError(f"structured_outputs.grammar is invalid: {exc}") from exc


def fill_bitmasks(grammars: dict[str, Grammar],
                  spec_tokens: dict[str, list[int]] | None = None) -> dict[str, np.ndarray]:
    """Per request, ``[1 + K, bitmask_words(vocab_size)]`` int32: the bitmask of its next token and, where the step
    verifies K proposals (``spec_tokens``), the bitmask after each of them, the row each verified position samples.

    All rows are one array, each request's a slice of it. Proposals were cut to what the grammar accepts when they
    were made (``Grammar.validate_tokens``), so each is accepted here for the masks after it and taken back before
    returning: the grammar is left where it was. A proposal that ends the
    constraint leaves the rows after it the terminated grammar's mask (its stop tokens); the scheduler drops
    whatever is sampled there.
    """
    if not grammars:
        return {}
    spec_tokens = spec_tokens or {}
    vocab_size = next(iter(grammars.values())).vocab_size
    starts, total = {}, 0
    for req_id in grammars:
        starts[req_id] = total
        total += 1 + len(spec_tokens.get(req_id, ()))
    masks = np.empty((total, bitmask_words(vocab_size)), dtype=np.int32)
    # NOTE: llguidance's thread pool (fill_next_token_bitmask_par) made a 16-stream step's masks no faster on two
    # cores, where torch's OpenMP threads wait spinning between steps.
    for req_id, grammar in grammars.items():
        grammar.fill_bitmask(masks[starts[req_id]])
    for req_id, proposals in spec_tokens.items():
        if req_id in grammars:
            _fill_after_proposals(req_id, grammars[req_id], proposals, masks[starts[req_id] + 1:])
    return {req_id: masks[start:start + 1 + len(spec_tokens.get(req_id, ()))] for req_id, start in starts.items()}


def _fill_after_proposals(req_id: str, grammar: Grammar, proposals: list[int], rows: np.ndarray) -> None:
    advanced = 0
    for row, token_id in zip(rows, proposals):
        if not grammar.is_terminated():  # tokens past the end are not history: nothing to roll back
            if not grammar.accept_token(token_id):
                raise RuntimeError(f"request {req_id}: proposal {token_id} was not cut to its grammar")
            advanced += 1
        grammar.fill_bitmask(row)
    grammar.rollback(advanced)
