"""Grammar engines compared: compile time and token-mask time per token for one JSON schema, on a model's vocabulary.

xgrammar, llguidance and outlines-core each walk the same valid JSON document token by token (the model's
own tokenization of it): at every position the engine fills the vocabulary bitmask, then accepts the token.
An engine whose mask forbids a token of the document is reported as wrong. Usage:

    flock /tmp/jido-bench.lock python benchmarks/grammar_engines.py [--model gemma-3-270m] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city", "zip"], "additionalProperties": False},
    },
    "required": ["name", "age", "email", "tags", "address"],
    "additionalProperties": False,
}
DOCUMENT = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "engines", "notes"],
            "address": {"city": "London", "zip": "W1"}}


def allowed(mask: np.ndarray, token_id: int) -> bool:
    return bool((int(mask[token_id // 32]) >> (token_id % 32)) & 1)


def walk(fill, accept, token_ids: list[int], mask: np.ndarray) -> tuple[list[float], bool]:
    """Seconds per mask over the document's tokens, and whether every token was allowed by its mask."""
    times, ok = [], True
    for token_id in token_ids:
        begin = time.perf_counter()
        fill(mask)
        times.append(time.perf_counter() - begin)
        ok = ok and allowed(mask, token_id)
        accept(token_id)
    return times, ok


def bench_llguidance(folder: Path, vocab_size: int, eos: int, token_ids: list[int]) -> dict:
    import llguidance

    begin = time.perf_counter()
    tokenizer = llguidance.LLTokenizer((folder / "tokenizer.json").read_text(), n_vocab=vocab_size, eos_token=eos)
    tokenizer_s = time.perf_counter() - begin
    begin = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    compile_s = time.perf_counter() - begin
    assert not matcher.is_error(), matcher.get_error()
    mask = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    def fill(out: np.ndarray) -> None:
        matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    times, ok = walk(fill, matcher.consume_token, token_ids, mask)
    return {"tokenizer_s": tokenizer_s, "compile_s": compile_s, "times": times, "ok": ok}


def bench_xgrammar(folder: Path, vocab_size: int, eos: int, token_ids: list[int]) -> dict:
    import torch
    import xgrammar
    from transformers import PreTrainedTokenizerFast

    begin = time.perf_counter()
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=[eos])
    compiler = xgrammar.GrammarCompiler(info)
    tokenizer_s = time.perf_counter() - begin
    begin = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    matcher = xgrammar.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - begin
    bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)

    def fill(out: np.ndarray) -> None:
        matcher.fill_next_token_bitmask(bitmask)
        out[:] = bitmask[0].numpy()

    def accept(token_id: int) -> None:
        assert matcher.accept_token(token_id)

    times, ok = walk(fill, accept, token_ids, np.zeros((vocab_size + 31) // 32, dtype=np.int32))
    del torch
    return {"tokenizer_s": tokenizer_s, "compile_s": compile_s, "times": times, "ok": ok}


def outlines_vocabulary(folder: Path, eos: int):
    """outlines-core's Vocabulary from tokenizer.json: each token's bytes (SentencePiece's ▁ a space, <0xHH> a
    byte)."""
    import outlines_core
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    byte_level = "ByteLevel" in json.dumps(json.loads(tokenizer.to_str()).get("decoder"))
    unicode_to_byte = {v: k for k, v in _bytes_to_unicode().items()}
    entries: dict[bytes, list[int]] = {}
    for token, token_id in tokenizer.get_vocab(with_added_tokens=True).items():
        if token_id in special or token_id == eos:
            continue
        if byte_level:
            data = bytes(unicode_to_byte[c] for c in token if c in unicode_to_byte)
        elif re.fullmatch(r"<0x[0-9A-F]{2}>", token):
            data = bytes([int(token[3:5], 16)])
        else:
            data = token.replace("\u2581", " ").encode()
        if data:
            entries.setdefault(data, []).append(token_id)
    return outlines_core.Vocabulary(eos, entries)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what byte-level BPE vocabularies are written in)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def bench_outlines(folder: Path, vocab_size: int, eos: int, token_ids: list[int]) -> dict:
    import outlines_core

    begin = time.perf_counter()
    vocabulary = outlines_vocabulary(folder, eos)
    tokenizer_s = time.perf_counter() - begin
    begin = time.perf_counter()
    regex = outlines_core.json_schema.build_regex_from_schema(json.dumps(SCHEMA))
    guide = outlines_core.Guide(outlines_core.Index(regex, vocabulary))
    compile_s = time.perf_counter() - begin

    def fill(out: np.ndarray) -> None:
        guide.write_mask_into(out.ctypes.data, out.size, out.itemsize)

    times, ok = walk(fill, guide.advance, token_ids, np.zeros((vocab_size + 31) // 32, dtype=np.int32))
    return {"tokenizer_s": tokenizer_s, "compile_s": compile_s, "times": times, "ok": ok}


ENGINES = {"llguidance": bench_llguidance, "xgrammar": bench_xgrammar, "outlines-core": bench_outlines}


def main() -> None:
    from jido.models.loader import resolve_model
    from jido.models.tokenizer import Tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a named model (default: the default model)")
    parser.add_argument("--engines", default=",".join(ENGINES))
    args = parser.parse_args()
    folder = resolve_model(args.model)
    tokenizer = Tokenizer.from_folder(folder)
    vocab_size = json.loads((folder / "config.json").read_text()).get("vocab_size") or tokenizer.vocab_size
    eos = tokenizer.eos_token_ids[0]
    token_ids = tokenizer.encode(json.dumps(DOCUMENT), add_special_tokens=False)
    print(f"model {folder.name}: vocabulary {vocab_size}, document {len(token_ids)} tokens")
    for name in args.engines.split(","):
        result = ENGINES[name](folder, vocab_size, eos, token_ids)
        times_us = [t * 1e6 for t in result["times"]]
        print(f"{name:14s} tokenizer {result['tokenizer_s']:7.2f} s  compile {result['compile_s'] * 1e3:9.1f} ms  "
              f"mask median {statistics.median(times_us):8.1f} us  p90 {np.percentile(times_us, 90):8.1f} us  "
              f"max {max(times_us):9.1f} us  document allowed: {result['ok']}")


if __name__ == "__main__":
    main()
