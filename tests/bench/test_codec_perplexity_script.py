"""benchmarks/codec_perplexity.py on a tiny model: the raw codec's round trip leaves the plain engine's perplexity
exactly, int8 moves it (a little), and every full block of context went through the codec."""
from __future__ import annotations

import argparse

import pytest
from benchmark_scripts import load_benchmark
from tiny_model_folder import write_tiny_model_folder

codec_perplexity = load_benchmark("codec_perplexity")


@pytest.fixture(scope="module")
def args(tmp_path_factory: pytest.TempPathFactory) -> argparse.Namespace:
    folder = write_tiny_model_folder(tmp_path_factory.mktemp("tiny"))
    return argparse.Namespace(model=str(folder), context_length=64, max_chunks=2, step_tokens=16)


def test_raw_round_trips_change_nothing_and_int8_changes_a_little(args: argparse.Namespace):
    plain = codec_perplexity.score(None, args)
    raw = codec_perplexity.score("raw", args)
    int8 = codec_perplexity.score("int8", args)
    assert raw["perplexity"] == plain["perplexity"] and raw["scored_tokens"] == plain["scored_tokens"] == 2 * 31
    assert int8["perplexity"] != plain["perplexity"]
    assert int8["perplexity"] == pytest.approx(plain["perplexity"], rel=0.05)
    assert int8["bytes_per_token"] < raw["bytes_per_token"]
