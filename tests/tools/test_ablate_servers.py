"""`jido ablate` end to end on the default model: real `jido serve` processes on 127.0.0.1, one at a time."""
from __future__ import annotations

import json

import pytest

from jido.tools.ablate import cli as ablate_cli
from jido.tools.ablate.results import METRICS
from jido.tools.ablate.techniques import TECHNIQUES, Setting, Technique

pytestmark = pytest.mark.slow

# Not in the registry: one flag no jido has, and one value every jido refuses when it starts.
MADE_UP = Technique("made-up", "scheduler", "a technique no jido has", (Setting("off"), Setting("on", ("--warp",))),
                    "off")
REFUSED = Technique("refused", "scheduler", "a value serve refuses at start",
                    (Setting("1"), Setting("0", ("--max-num-seqs", "0"))), "1")


def test_two_techniques_ablated_on_real_servers_with_the_ratios_of_what_they_measured(tmp_path, monkeypatch,
                                                                                        gemma_folder, capsys):
    monkeypatch.setitem(TECHNIQUES, MADE_UP.name, MADE_UP)
    monkeypatch.setitem(TECHNIQUES, REFUSED.name, REFUSED)
    result_file = tmp_path / "ablate.json"
    # 4 prompts sharing one 64-token system prompt: prefix caching has blocks to hit.
    status = ablate_cli.ablate_main([
        "--techniques", "prefix-caching,chunked-prefill,made-up,refused", "--repeats", "1",
        "--serve-args", "--kv-cache-memory 64MiB --max-model-len 512 --dtype float32",
        "--dataset-name", "shared-prefix", "--num-prefixes", "1", "--prefix-len", "64", "--random-input-len", "16",
        "--random-output-len", "6", "--num-prompts", "4", "--max-concurrency", "2", "--num-warmups", "1",
        "--ignore-eos", "--disable-tqdm", "--result-file", str(result_file)])
    out = capsys.readouterr().out
    assert status == 0
    result = json.loads(result_file.read_text())
    assert set(result["baseline"]) == set(METRICS) and result["baseline"]["completed"] == 4
    assert result["baseline"]["total_output_tokens"] == 24 and result["baseline"]["failed"] == 0
    variants = {(v["technique"], v["value"]): v for v in result["variants"]}
    assert set(variants) == {("prefix-caching", "off"), ("chunked-prefill", "off")}
    for variant in variants.values():
        assert variant["metrics"]["completed"] == 4 and len(variant["runs"]) == 1
        for key in ("output_throughput", "p99_ttft_ms", "median_tpot_ms", "server_max_kv_cache_usage"):
            assert variant["ratios"][key] == pytest.approx(variant["metrics"][key] / result["baseline"][key]), key
    # The servers differed as their flags say: only the baseline reused the shared prompt's blocks.
    assert result["baseline"]["server_prefix_cache_hit_rate"] > 0.3
    assert not variants[("prefix-caching", "off")]["metrics"]["server_prefix_cache_hit_rate"]
    assert "--no-enable-chunked-prefill" in variants[("chunked-prefill", "off")]["serve_args"]
    unavailable = {(u["technique"], u["value"]): u["reason"] for u in result["unavailable"]}
    assert unavailable[("made-up", "on")] == "jido serve has no --warp flag"
    assert unavailable[("refused", "0")].startswith(
        "jido serve exited with 2 before listening: jido: error: max_num_seqs must be a positive integer, got 0")
    assert "prefix-caching" in out and "Order to apply what paid" in out and "doctor's reading" in out
    assert (tmp_path / "ablate.png").stat().st_size > 0
    # Every server drained and exited on its SIGTERM before the next one started.
    logs = sorted((tmp_path / "ablate-logs").glob("*.log"))
    assert len(logs) == 4 and all("SIGTERM: drained, exiting" in log.read_text() for log in logs[:3])
