"""The load generator against the fake server: timings, percentiles, goodput, errors, /metrics, result keys."""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp

import numpy as np
import pytest

from fake_openai_server import (KV_USAGE, PREFIX_HITS_PER_REQUEST, PREFIX_QUERIES_PER_REQUEST, QUEUE_SECONDS_PER_REQUEST,
                               STEP_REQUESTS_PER_REQUEST, STEPS_PER_REQUEST)

from jido.bench.cli import bench_main
from jido.bench.client import MAX_RETRIES, SSEDecoder
from jido.bench.runner import arrival_offsets
from jido.bench.server_metrics import GaugeSampler

TTFTS_MS = [40, 80, 120, 160, 200]
ITL_MS, OUTPUT_LEN = 15, 5
TOLERANCE_MS = 25  # a shared 2-core machine delays threads; the schedule's steps are wider than this

VLLM_KEYS = ["completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
             "output_throughput", "total_token_throughput", "request_goodput"] + [
    f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p90", "p95", "p99")]


def write_schedule(path: Path, extra: list[str] = ()) -> Path:
    lines = [json.dumps({"prompt": f"ttft_ms={t} itl_ms={ITL_MS}", "output_len": OUTPUT_LEN}) for t in TTFTS_MS]
    path.write_text("\n".join(lines + [json.dumps({"prompt": p, "output_len": 2}) for p in extra]) + "\n")
    return path


def run_bench(tmp_path: Path, base_url: str, *args: str) -> dict:
    out = tmp_path / "result.json"
    argv = ["--base-url", base_url, "--dataset-name", "jsonl", "--disable-tqdm", "--no-plots",
            "--result-filename", str(out), *args]
    assert bench_main(argv) == 0
    return json.loads(out.read_text())


def test_timings_percentiles_and_goodput_match_the_servers_schedule(tmp_path, fake_server):
    base_url, _ = fake_server
    data = write_schedule(tmp_path / "schedule.jsonl")
    result = run_bench(tmp_path, base_url, "--dataset-path", str(data), "--num-prompts", "5",
                       "--max-concurrency", "1", "--goodput", "ttft=100")
    assert result["completed"] == 5 and result["failed"] == 0
    assert result["total_output_tokens"] == 5 * OUTPUT_LEN
    assert result["total_input_tokens"] == 5 * 7  # the server's usage.prompt_tokens wins over the local count
    for key in ("mean", "median", "p90", "p95", "p99"):
        expected = np.mean(TTFTS_MS) if key == "mean" else np.percentile(TTFTS_MS, 50 if key == "median" else int(key[1:]))
        assert result[f"{key}_ttft_ms"] == pytest.approx(expected, abs=TOLERANCE_MS)
    assert result["median_tpot_ms"] == pytest.approx(ITL_MS, abs=TOLERANCE_MS / 2)
    assert result["median_itl_ms"] == pytest.approx(ITL_MS, abs=TOLERANCE_MS / 2)
    expected_e2el = np.array(TTFTS_MS) + (OUTPUT_LEN - 1) * ITL_MS
    assert result["median_e2el_ms"] == pytest.approx(np.median(expected_e2el), abs=TOLERANCE_MS)
    assert len(result["itls"]) == 5 and all(len(gaps) == OUTPUT_LEN - 1 for gaps in result["itls"])
    # Two of the five first tokens come within 100 ms; serially, the run lasts about the sum of the E2ELs.
    assert result["request_goodput"] * result["duration"] == pytest.approx(2)
    assert result["duration"] == pytest.approx(expected_e2el.sum() / 1000, abs=0.3)
    assert result["request_throughput"] == pytest.approx(5 / result["duration"])
    assert result["output_throughput"] == pytest.approx(5 * OUTPUT_LEN / result["duration"])
    assert set(VLLM_KEYS) <= set(result)


def test_chat_endpoint_times_the_first_content_not_the_role_chunk(tmp_path, fake_server):
    base_url, state = fake_server
    data = write_schedule(tmp_path / "schedule.jsonl")
    result = run_bench(tmp_path, base_url, "--dataset-path", str(data), "--num-prompts", "5",
                       "--endpoint", "/v1/chat/completions", "--max-concurrency", "5", "--ignore-eos")
    assert result["backend"] == "openai-chat"
    assert result["mean_ttft_ms"] == pytest.approx(np.mean(TTFTS_MS), abs=TOLERANCE_MS)
    assert state.payloads[-1]["messages"][0]["role"] == "user"
    assert state.payloads[-1]["ignore_eos"] is True and state.payloads[-1]["stream"] is True


def test_failed_requests_are_counted_and_reported_first_with_the_servers_error(tmp_path, fake_server, capsys):
    base_url, _ = fake_server
    data = write_schedule(tmp_path / "schedule.jsonl", extra=["please fail"])
    result = run_bench(tmp_path, base_url, "--dataset-path", str(data), "--num-prompts", "12",
                       "--max-concurrency", "6")
    assert (result["completed"], result["failed"]) == (10, 2)
    assert result["errors"][5].startswith("HTTP 500") and "asked to fail" in result["errors"][5]
    assert result["first_errors"] == [{"count": 2, "error": result["errors"][5]}]
    captured = capsys.readouterr()
    warning = "WARNING: 2 of 12 requests FAILED; the figures below cover the 10 that completed. First error: HTTP 500"
    assert captured.out.startswith(warning) and "error (2x): HTTP 500" in captured.out
    assert captured.err.splitlines()[-1].startswith("jido bench: " + warning)


def test_kept_alive_connections_the_server_resets_are_retried_and_counted(tmp_path, fake_server):
    base_url, state = fake_server
    data = write_schedule(tmp_path / "schedule.jsonl")
    state.num_kept_alive_to_reset = 3
    result = run_bench(tmp_path, base_url, "--dataset-path", str(data), "--num-prompts", "6",
                       "--max-concurrency", "1")
    assert (result["completed"], result["failed"]) == (6, 0)
    assert state.num_resets == 3 and result["num_retries"] == 3
    assert result["first_errors"] == []


def test_a_request_body_cut_off_by_a_reset_is_sent_again(tmp_path, fake_server):
    # 8 MB does not fit in the socket buffers, so the reset breaks the body's write (ClientOSError, the
    # "Can not write request body" that llama-server's closed keep-alives cause) rather than the read.
    base_url, state = fake_server
    data = tmp_path / "big.jsonl"
    data.write_text(json.dumps({"prompt": "x" * 8_000_000, "output_len": 2}) + "\n")
    state.num_kept_alive_to_reset = 1
    result = run_bench(tmp_path, base_url, "--dataset-path", str(data), "--num-prompts", "1")
    assert (result["completed"], result["failed"], result["num_retries"]) == (1, 0, 1)
    assert state.num_resets == 1 and len(state.payloads[-1]["prompt"]) == 8_000_000


def test_retries_are_bounded_and_a_warm_up_that_keeps_failing_is_a_clear_error(tmp_path, fake_server, capsys):
    base_url, state = fake_server
    data = write_schedule(tmp_path / "schedule.jsonl")
    state.num_connections_to_drop = MAX_RETRIES + 1
    assert bench_main(["--base-url", base_url, "--dataset-name", "jsonl", "--dataset-path", str(data),
                       "--disable-tqdm"]) == 2
    error = capsys.readouterr().err
    assert "ServerDisconnectedError" in error and f"(after {MAX_RETRIES} retries)" in error
    assert len(state.payloads) == MAX_RETRIES + 1


def test_server_metrics_over_the_run_are_differences_of_the_counters(tmp_path, fake_server):
    base_url, _ = fake_server
    data = write_schedule(tmp_path / "schedule.jsonl")
    result = run_bench(tmp_path, base_url, "--dataset-path", str(data), "--num-prompts", "5")
    assert result["server_metrics_available"] is True
    assert result["server_prefix_cache_hit_rate"] == pytest.approx(PREFIX_HITS_PER_REQUEST / PREFIX_QUERIES_PER_REQUEST)
    assert result["server_mean_queue_time_ms"] == pytest.approx(QUEUE_SECONDS_PER_REQUEST * 1000)
    assert result["server_mean_kv_cache_usage"] == pytest.approx(KV_USAGE)
    assert result["server_mean_batch_size"] == pytest.approx(STEP_REQUESTS_PER_REQUEST / STEPS_PER_REQUEST)
    # 5 requests of 3 drafts and 9 proposals, 6 accepted: vLLM's mean acceptance length 1 + 6 / 3.
    assert (result["server_spec_decode_num_drafts"], result["server_spec_decode_num_draft_tokens"],
            result["server_spec_decode_num_accepted_tokens"]) == (15, 45, 30)
    assert result["server_spec_decode_mean_acceptance_length"] == pytest.approx(3.0)
    assert result["server_spec_decode_acceptance_rate"] == pytest.approx(2 / 3)
    assert result["server_spec_decode_acceptance_rate_per_pos"] == pytest.approx([1, 2 / 3, 1 / 3])
    assert result["server_info"]["models"] == [{"id": "fake-model", "owned_by": "t"}]
    assert result["model_id"] == "fake-model"
    assert {"date", "machine", "request_rate"} <= set(result) and result["request_rate"] == "inf"


def test_sweep_over_concurrency_saves_one_run_per_level_and_plots(tmp_path, fake_server):
    pytest.importorskip("matplotlib")
    base_url, _ = fake_server
    data = write_schedule(tmp_path / "schedule.jsonl")
    argv = ["--base-url", base_url, "--dataset-name", "jsonl", "--dataset-path", str(data), "--num-prompts", "5",
            "--disable-tqdm", "--sweep-concurrency", "1,5", "--save-result", "--result-dir", str(tmp_path),
            "--result-filename", "sweep.json"]
    assert bench_main(argv) == 0
    result = json.loads((tmp_path / "sweep.json").read_text())
    assert result["sweep_key"] == "max_concurrency"
    assert [r["max_concurrency"] for r in result["runs"]] == [1, 5]
    assert result["runs"][0]["duration"] > result["runs"][1]["duration"]
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["sweep-cdf0.png", "sweep-cdf1.png", "sweep-sweep.png"]
    assert all((tmp_path / p).read_bytes().startswith(b"\x89PNG") for p in pngs)


def test_unreachable_server_is_a_clear_error(capsys):
    assert bench_main(["--base-url", "http://127.0.0.1:9", "--num-prompts", "1", "--random-input-len", "4",
                       "--disable-tqdm"]) == 2
    assert "listed no model" in capsys.readouterr().err


def test_sse_decoder_joins_events_split_anywhere_in_the_byte_stream():
    stream = 'data: {"a": "é"}\n\ndata: line1\ndata: line2\r\n\r\n: comment\n\ndata: [DONE]\n\n'.encode()
    decoder = SSEDecoder()
    events = [e for i in range(len(stream)) for e in decoder.feed(stream[i:i + 1])]
    assert events == ['{"a": "é"}', "line1\nline2", "[DONE]"]


def test_poisson_arrivals_have_the_requested_mean_gap_and_repeat_for_a_seed():
    offsets = arrival_offsets(4000, rate=8.0, burstiness=1.0, seed=3)
    assert offsets[0] == 0.0 and np.all(np.diff(offsets) >= 0)
    assert np.diff(offsets).mean() == pytest.approx(1 / 8.0, rel=0.05)
    assert np.diff(offsets).std() == pytest.approx(1 / 8.0, rel=0.08)  # exponential: std == mean
    assert np.array_equal(offsets, arrival_offsets(4000, 8.0, 1.0, seed=3))
    assert not arrival_offsets(5, float("inf"), 1.0, seed=3).any()


def test_one_token_answers_have_no_tpot_or_itl_rather_than_zero(tmp_path, fake_server, capsys):
    base_url, _ = fake_server
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"prompt": "ttft_ms=20", "output_len": 1}) + "\n")
    result = run_bench(tmp_path, base_url, "--dataset-path", str(data), "--num-prompts", "2")
    assert result["completed"] == 2 and result["tpots"] == [None, None] and result["itls"] == [[], []]
    for name in ("tpot", "itl"):
        assert all(result[f"{stat}_{name}_ms"] is None for stat in ("mean", "median", "std", "p90", "p95", "p99"))
    assert result["mean_ttft_ms"] > 0
    table = capsys.readouterr().out
    assert "Mean TPOT (ms):                                n/a" in table
    assert "P99 ITL (ms):                                  n/a" in table


def test_without_tokenize_on_the_server_lengths_are_words_and_the_output_says_so(tmp_path, fake_server, capsys):
    base_url, _ = fake_server
    data = write_schedule(tmp_path / "schedule.jsonl")
    result = run_bench(tmp_path, base_url, "--dataset-path", str(data), "--num-prompts", "2")
    assert result["prompt_len_unit"] == "words"
    assert result["server_max_kv_cache_usage_source"] == "sampled every second"
    captured = capsys.readouterr()
    assert "prompt lengths counted in words and punctuation marks, not model tokens" in captured.err
    assert "Prompt lengths drawn in: words" in captured.out


def test_stopping_the_gauge_sampler_keeps_the_scrape_under_way(fake_server):
    # jido resets its KV peak when it answers a scrape: an answer dropped at the end of a run loses the peak.
    base_url, state = fake_server
    state.metrics_delay_s = 0.3

    async def sample() -> list:
        async with aiohttp.ClientSession() as session:
            sampler = GaugeSampler(session, f"{base_url}/metrics", interval_s=0.01)
            task = asyncio.create_task(sampler.run())
            deadline = time.monotonic() + 10
            while state.num_scrapes_started < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            sampler.stop()
            await task
            return sampler.samples

    samples = asyncio.run(sample())
    assert state.num_scrapes_started == 2 and len(samples) == 2
