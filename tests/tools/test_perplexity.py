"""`jido eval perplexity`: llama-perplexity's chunks and scored tokens, checked against transformers in float64."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from tiny_model_folder import BOS_ID, VOCAB_SIZE, reference_logprobs

from jido import LLM
from jido.cli import main
from jido.tools.perplexity import (PerplexityConfig, chunk_token_ids, evaluate, perplexity_and_stderr,
                                   scored_positions)

CONTEXT_LENGTH = 24
# Chunked prefill (16 tokens a step) and two requests at a time: chunks are scored across steps and batches.
ENGINE = {"dtype": "float32", "kv_cache_memory": "4MiB", "block_size": 4, "max_num_seqs": 2,
          "max_num_batched_tokens": 16}


def _words(seed: int, num_words: int) -> str:
    ids = torch.randint(3, VOCAB_SIZE, (num_words,), generator=torch.Generator().manual_seed(seed))
    return " ".join(f"w{i}" for i in ids.tolist())


@pytest.fixture(scope="module")
def tiny_llm(tiny_model_folder: Path) -> LLM:
    return LLM(str(tiny_model_folder), **ENGINE)


def _cli(folder: Path, text_file: Path, *flags: str) -> int:
    engine_flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
    return main(["--log-level", "warning", "eval", "perplexity", "--model", str(folder), *engine_flags, *flags,
                 str(text_file)])


def test_chunks_are_consecutive_start_with_bos_in_place_of_their_first_token_and_drop_the_tail():
    ids = list(range(100, 111))  # 11 tokens: two chunks of 4, a tail of 3
    assert chunk_token_ids(ids, 4, BOS_ID) == [[BOS_ID, 101, 102, 103], [BOS_ID, 105, 106, 107]]
    assert chunk_token_ids(ids, 4, BOS_ID, max_chunks=1) == [[BOS_ID, 101, 102, 103]]
    assert chunk_token_ids(ids, 4, None) == [[100, 101, 102, 103], [104, 105, 106, 107]]
    assert ids == list(range(100, 111))  # the text's tokens are left as they were
    assert chunk_token_ids(ids, 12, BOS_ID) == []


def test_scored_tokens_are_those_after_the_first_half_of_the_chunk_as_llama_cpp_reads_them():
    # llama.cpp: first = n_ctx / 2; logit rows first .. n_ctx - 2 predict the tokens one further on.
    assert scored_positions(512) == range(257, 512) and len(scored_positions(512)) == 255
    assert list(scored_positions(4)) == [3]
    assert list(scored_positions(5)) == [3, 4]
    assert list(scored_positions(3)) == [2]


def test_standard_error_is_llama_cpps_from_the_mean_and_mean_square_of_the_nlls():
    ppl, stderr = perplexity_and_stderr([1.0, 2.0, 3.0])
    assert ppl == pytest.approx(math.exp(2.0))
    # mean(v^2) - mean(v)^2 = 14/3 - 4 = 2/3; sqrt(2/3 / (3 - 1)) times the perplexity.
    assert stderr == pytest.approx(math.exp(2.0) * math.sqrt(1 / 3))
    assert perplexity_and_stderr([0.5]) == (pytest.approx(math.exp(0.5)), None)


def test_perplexity_is_transformers_float64_log_softmax_on_the_same_chunks_and_tokens(tiny_llm, tiny_model_folder):
    text = _words(0, 3 * CONTEXT_LENGTH + 5)  # with BOS: 3 chunks and a tail of 6 tokens
    result = evaluate(tiny_llm, text, PerplexityConfig(context_length=CONTEXT_LENGTH))
    ids = [BOS_ID, *(int(w[1:]) for w in text.split())]
    nlls = []
    for i in range(3):
        chunk = [BOS_ID, *ids[i * CONTEXT_LENGTH + 1:(i + 1) * CONTEXT_LENGTH]]
        reference = reference_logprobs(tiny_model_folder, chunk)
        nlls += [-reference[p - 1, chunk[p]].item() for p in range(CONTEXT_LENGTH // 2 + 1, CONTEXT_LENGTH)]
    expected = math.exp(math.fsum(nlls) / len(nlls))
    assert (result.num_chunks, result.num_scored_tokens, result.num_text_tokens) == (3, 3 * 11, len(ids))
    assert abs(result.perplexity - expected) / expected < 1e-4
    assert result.stderr == pytest.approx(perplexity_and_stderr(nlls)[1], rel=1e-3)
    assert result.wall_s > 0 and result.tokens_per_s == pytest.approx(3 * CONTEXT_LENGTH / result.wall_s)


def test_max_chunks_scores_only_the_first_chunks(tiny_llm):
    text = _words(1, 3 * CONTEXT_LENGTH)
    one = evaluate(tiny_llm, text, PerplexityConfig(context_length=CONTEXT_LENGTH, max_chunks=1))
    first_only = evaluate(tiny_llm, " ".join(text.split()[:CONTEXT_LENGTH - 1]),
                          PerplexityConfig(context_length=CONTEXT_LENGTH))
    assert (one.num_chunks, one.num_scored_tokens) == (1, 11)
    assert one.perplexity == pytest.approx(first_only.perplexity, rel=1e-6)


def test_cli_json_prints_the_result_with_model_dtype_engine_settings_and_machine(tiny_model_folder, tmp_path, capsys):
    text_file = tmp_path / "text.txt"
    text_file.write_text(_words(2, 2 * CONTEXT_LENGTH), encoding="utf-8")
    assert _cli(tiny_model_folder, text_file, "--json", f"--context-length={CONTEXT_LENGTH}") == 0
    record = json.loads(capsys.readouterr().out)
    assert set(record) == {"model", "device", "dtype", "attention_backend", "perplexity", "stderr",
                           "num_scored_tokens", "num_chunks", "context_length", "num_text_tokens", "wall_s",
                           "tokens_per_s", "scored_positions", "engine", "machine"}
    assert (record["model"], record["device"], record["dtype"]) == (tiny_model_folder.name, "cpu", "float32")
    assert (record["attention_backend"], record["num_chunks"]) == ("tiled", 2)
    assert record["scored_positions"] == "13..23 of each chunk's 0..23"
    assert {k: record["engine"][k] for k in ENGINE} == ENGINE
    assert {"cpu_model", "cpu_flags", "torch"} <= set(record["machine"])


def test_cli_line_states_perplexity_error_tokens_chunks_and_speed(tiny_model_folder, tmp_path, capsys):
    text_file = tmp_path / "text.txt"
    text_file.write_text(_words(3, CONTEXT_LENGTH), encoding="utf-8")
    assert _cli(tiny_model_folder, text_file, f"--context-length={CONTEXT_LENGTH}") == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("perplexity ") and " ± " in line and "over 11 tokens (1 chunk of 24" in line
    assert line.endswith("tokens/s")


@pytest.mark.parametrize(("text", "flags", "message"), [
    ("", (), "is empty"),
    (" \n", (), "is empty"),
    ("w3 w4 w5", ("--context-length=8",), "the text has 4 tokens, fewer than one chunk of context_length 8"),
    (_words(4, 300), ("--context-length=256",), "max_model_len is 256, so a chunk may have at most 255 tokens"),
    ("w3", ("--context-length=2",), "context_length must be an integer >= 3"),
])
def test_cli_refuses_texts_too_short_and_chunks_too_long_saying_why(tiny_model_folder, tmp_path, capsys, text, flags,
                                                                    message):
    text_file = tmp_path / "text.txt"
    text_file.write_text(text, encoding="utf-8")
    assert _cli(tiny_model_folder, text_file, *flags) == 2
    assert message in capsys.readouterr().err
