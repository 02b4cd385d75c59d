"""Workloads: the same prompts for the same seed, with the token lengths asked for, cut from real text."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from jido.bench.config import BenchConfig, parse_slos
from jido.bench.corpus import Corpus
from jido.bench.datasets import (CONVERSATION_MAX_INPUT, CONVERSATION_MAX_TOTAL, conversation_lengths,
                                 sample_requests)
from jido.bench.tokens import TokenizerJsonCounter, WordCounter, count_tokens
from jido.utils.reference_text import reference_text


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return Corpus(reference_text(), WordCounter())


def sample(corpus: Corpus, **kwargs) -> list:
    return sample_requests(BenchConfig(**kwargs), corpus)


def test_reference_text_is_long_real_prose(corpus):
    assert corpus.num_tokens > 80_000
    words = corpus.text.split()
    assert len(set(words)) > 5_000 and "the" in words  # varied English, not repeated tokens


@pytest.mark.parametrize("name", ["random", "conversation", "shared-prefix", "long-doc-qa", "mixed", "rewrite"])
def test_every_dataset_repeats_for_a_seed_and_changes_with_it(corpus, name):
    first = sample(corpus, dataset_name=name, num_prompts=12, seed=1, random_input_len=64, document_len=256)
    again = sample(corpus, dataset_name=name, num_prompts=12, seed=1, random_input_len=64, document_len=256)
    other = sample(corpus, dataset_name=name, num_prompts=12, seed=2, random_input_len=64, document_len=256)
    assert first == again and first != other and len(first) == 12


def test_random_prompts_have_exactly_the_input_len_when_the_range_is_zero(corpus):
    requests = sample(corpus, num_prompts=20, random_input_len=300, random_output_len=40)
    assert [r.prompt_len for r in requests] == [300] * 20
    assert [count_tokens(corpus.counter, r.prompt) for r in requests] == [300] * 20
    assert {r.output_len for r in requests} == {40}


def test_rewrite_prompts_hold_a_passage_of_the_input_len_that_the_answer_is_to_reproduce(corpus):
    requests = sample(corpus, dataset_name="rewrite", num_prompts=20, random_input_len=120, random_output_len=100)
    for request in requests:
        passage = request.prompt.split(":\n", 1)[1].rsplit("\n\n", 1)[0]
        assert passage in corpus.text and count_tokens(corpus.counter, passage) == 120
        assert request.prompt.endswith(("Rewritten passage:\n", "Copy:\n")) and request.output_len == 100
    assert len({r.prompt.split("\n", 1)[0] for r in requests}) == 2  # both instructions occur


def test_random_lengths_fill_the_range_ratio(corpus):
    requests = sample(corpus, num_prompts=400, random_input_len=100, random_output_len=50, random_range_ratio=0.5)
    inputs, outputs = np.array([r.prompt_len for r in requests]), np.array([r.output_len for r in requests])
    assert inputs.min() >= 50 and inputs.max() <= 150 and inputs.mean() == pytest.approx(100, rel=0.05)
    assert outputs.min() >= 25 and outputs.max() <= 75 and outputs.mean() == pytest.approx(50, rel=0.05)


def test_conversation_lengths_are_heavy_tailed_and_filtered_like_vllms_sharegpt():
    lengths = np.array(conversation_lengths(5000, np.random.default_rng(0)))
    inputs, outputs = lengths[:, 0], lengths[:, 1]
    assert inputs.max() <= CONVERSATION_MAX_INPUT and (lengths.sum(axis=1) <= CONVERSATION_MAX_TOTAL).all()
    assert inputs.min() >= 4 and outputs.min() >= 4
    # Means near the ShareGPT figures (161 in, 338 out; the filter trims the tails a little) ...
    assert 130 < inputs.mean() < 170 and 290 < outputs.mean() < 345
    # ... and a right tail: the mean well above the median, a p99 several times the median.
    assert inputs.mean() > 1.4 * np.median(inputs) and np.percentile(inputs, 99) > 5 * np.median(inputs)


def test_conversation_prompts_measure_the_drawn_length(corpus):
    requests = sample(corpus, dataset_name="conversation", num_prompts=50)
    drawn = conversation_lengths(50, np.random.default_rng(0))
    assert [r.output_len for r in requests] == [o for _, o in drawn]
    assert all(abs(r.prompt_len - i) <= 1 for r, (i, _) in zip(requests, drawn))


def test_shared_prefix_uses_the_given_number_of_system_prompts(corpus):
    requests = sample(corpus, dataset_name="shared-prefix", num_prompts=24, num_prefixes=3, prefix_len=200,
                      random_input_len=30)
    prefixes = {r.prompt.split("\n\n")[0][:200] for r in requests}
    assert len(prefixes) == 3
    assert all(r.prompt_len == pytest.approx(230, abs=2) for r in requests)


def test_long_doc_qa_asks_several_different_questions_about_each_document(corpus):
    requests = sample(corpus, dataset_name="long-doc-qa", num_prompts=12, num_documents=3, document_len=500)
    by_doc: dict[str, set[str]] = {}
    for r in requests:
        document, _, question = r.prompt.rpartition("\n\nQuestion: ")
        by_doc.setdefault(document, set()).add(question)
    assert len(by_doc) == 3 and all(len(questions) == 4 for questions in by_doc.values())
    assert all(count_tokens(corpus.counter, d) == pytest.approx(500, abs=2) for d in by_doc)


def test_mixed_puts_long_prompts_among_short_streams(corpus):
    requests = sample(corpus, dataset_name="mixed", num_prompts=20, mixed_long_fraction=0.25, mixed_long_len=400,
                      mixed_long_output_len=8, random_input_len=32, random_output_len=96)
    long = [i for i, r in enumerate(requests) if r.prompt_len > 100]
    assert len(long) == 5 and long != [0, 1, 2, 3, 4]
    assert all(requests[i].prompt_len == pytest.approx(400, abs=2) and requests[i].output_len == 8 for i in long)
    short = [r for i, r in enumerate(requests) if i not in long]
    assert all(r.prompt_len == pytest.approx(32, abs=2) and r.output_len == 96 for r in short)


def test_jsonl_prompts_cycle_and_bad_lines_name_the_line(corpus, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "hello there", "output_len": 3}) + "\n" + json.dumps({"prompt": "x"}) + "\n")
    requests = sample(corpus, dataset_name="jsonl", dataset_path=str(path), num_prompts=3, random_output_len=9)
    assert [(r.prompt, r.prompt_len, r.output_len) for r in requests] == [
        ("hello there", 2, 3), ("x", 1, 9), ("hello there", 2, 3)]
    path.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: expected"):
        sample(corpus, dataset_name="jsonl", dataset_path=str(path))


def test_a_tokenizer_json_counts_its_own_tokens(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "the": 1, "cat": 2, "sat": 3}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    counter = TokenizerJsonCounter(tmp_path)
    assert count_tokens(counter, "the cat sat on the mat.") == 7
    corpus = Corpus("the cat sat on the mat. " * 10, counter)
    assert corpus.window(3, 5) == "on the mat. the"  # on, the, mat, ".", the


def test_bad_settings_say_what_is_allowed():
    with pytest.raises(ValueError, match="dataset_name must be one of random, conversation"):
        BenchConfig(dataset_name="sharegpt")
    with pytest.raises(ValueError, match="needs --dataset-path"):
        BenchConfig(dataset_name="jsonl")
    with pytest.raises(ValueError, match="KEY=MS with KEY one of ttft, tpot, e2el"):
        BenchConfig(goodput="latency=3")
    with pytest.raises(ValueError, match="comma-separated ints"):
        BenchConfig(sweep_concurrency="1,x")
    assert parse_slos("ttft:500 tpot:50") == parse_slos("ttft=500,tpot=50") == {"ttft": 500.0, "tpot": 50.0}
    points = BenchConfig(sweep_rate="1,inf").sweep_points()
    assert [p.request_rate for p in points] == [1.0, float("inf")] and points[0].sweep_rate is None
    assert dataclasses.replace(points[0]).sweep_points() == [points[0]]
