"""benchmarks/offline_throughput.py: every ratio is jido ÷ transformers, and batch 1 or the batched run can run alone."""
from __future__ import annotations


import pytest
from benchmark_scripts import load_benchmark

pytest.importorskip("torch")



@pytest.fixture(scope="module")
def offline():
    return load_benchmark("offline_throughput")


def test_every_ratio_is_jido_over_transformers_ttft_included(offline):
    results = {"jido": {"batch1": {"decode_tok_s": 20.0, "ttft_s": 0.2},
                        "batch32": {"output_tok_s": 90.0}},
               "transformers": {"batch1": {"decode_tok_s": 10.0, "ttft_s": 0.1},
                                "batch32": {"output_tok_s": 120.0}}}
    # jido decodes twice as fast and takes twice as long to its first token: both ratios read 2.0.
    assert offline.ratios(results) == {"batch1_decode_tok_s": 2.0, "batch1_ttft_s": 2.0,
                                       "batch32_output_tok_s": 0.75}
    del results["jido"]["batch32"], results["transformers"]["batch32"]
    assert offline.ratios(results) == {"batch1_decode_tok_s": 2.0, "batch1_ttft_s": 2.0}


def test_only_runs_batch_1_or_the_batched_run_alone(offline):
    assert offline.chosen_runs(None) == ("batch1", "batch32")
    assert offline.chosen_runs("batch1") == ("batch1",)
    assert offline.chosen_runs("batched") == ("batch32",)


def test_the_record_names_the_cpu_features_and_the_torch_build(offline):
    import torch

    from jido.utils.cpu import cpu_info

    record = offline.machine()
    assert {k: record[k] for k in cpu_info().as_dict()} == cpu_info().as_dict()
    assert record["torch"] == torch.__version__ and record["torch_threads"] == torch.get_num_threads()
    assert record["onednn"] is None or record["onednn"].startswith("v")  # e.g. v3.12.0
