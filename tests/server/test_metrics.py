"""The server's Prometheus metrics without a model: names, buckets, zeros, multiprocess files, exposition."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jido.engine.async_engine import StepReport
from jido.engine.outputs import CompletionOutput, RequestOutput
from jido.metrics.stats import IterationStats, SchedulerStats, SpecDecodingStats
from jido.planner.prometheus import parse_metrics
from jido.server.metrics import MULTIPROC_DIR_ENV, RequestTimer, ServerMetrics

TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
           960.0, 1920.0, 7680.0)
STEP = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TOKENS_600 = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)
# What the hand-written exporter exported before prometheus_client (captured from it with max_model_len=600),
# plus what was added since (the prepare phase, the KV peak, the batch size, the prefill time):
# family -> type, help, labels besides model_name with their values, histogram buckets.
BEFORE = {
    "vllm:num_requests_running": ("gauge", "Sequences running in the engine.", {}, ()),
    "vllm:num_requests_waiting": ("gauge", "Sequences accepted but not yet running.", {}, ()),
    "vllm:kv_cache_usage_perc": ("gauge", "Fraction of KV blocks in use (1 = full).", {}, ()),
    "jido:kv_cache_usage_perc_max": ("gauge",
                                     "Highest fraction of KV blocks in use since the previous scrape, within steps too.",
                                     {}, ()),
    "vllm:prefix_cache_queries": ("counter", "Prompt tokens looked up in the prefix cache.", {}, ()),
    "vllm:prefix_cache_hits": ("counter", "Prompt tokens found in the prefix cache.", {}, ()),
    "vllm:num_preemptions": ("counter", "Sequences preempted for lack of KV blocks.", {}, ()),
    "vllm:prompt_tokens": ("counter", "Prompt tokens of finished requests.", {}, ()),
    "vllm:generation_tokens": ("counter", "Generated tokens, counted as they stream.", {}, ()),
    "vllm:request_success": ("counter", "Finished requests, by finish reason.",
                             {"finished_reason": ("abort", "length", "stop")}, ()),
    "vllm:time_to_first_token_seconds": ("histogram", "Arrival to first token.", {}, TTFT),
    "vllm:inter_token_latency_seconds": ("histogram", "Time between output tokens.", {}, ITL),
    "vllm:request_time_per_output_token_seconds": (
        "histogram", "Per request: (last token - first token) / (output tokens - 1).", {}, ITL),
    "vllm:e2e_request_latency_seconds": ("histogram", "Arrival to last token.", {}, REQUEST),
    "vllm:request_queue_time_seconds": ("histogram", "Arrival to first scheduled, less any wait for KV from another "
                                        "instance.", {}, REQUEST),
    "vllm:request_prefill_time_seconds": ("histogram", "First scheduled to first token, for requests that computed "
                                          "their prompt here.", {}, TTFT),
    "vllm:request_prompt_tokens": ("histogram", "Prompt tokens per finished request.", {}, TOKENS_600),
    "vllm:request_generation_tokens": ("histogram", "Output tokens per finished request.", {}, TOKENS_600),
    "jido:step_time_seconds": ("histogram", "Engine step time by phase.",
                               {"phase": ("model", "prepare", "propose", "sample", "schedule", "update")}, STEP),
    "jido:step_tokens": ("histogram", "Tokens computed per engine step.", {}, TOKENS_600),
    "jido:step_num_requests": ("histogram", "Requests computed per engine step that computed any (the batch size).",
                               {}, TOKENS_600),
    "jido:requests_rejected": ("counter", "Requests refused before reaching the engine, by reason.",
                               {"reason": ("overload", "stopped")}, ()),
    "jido:requests_aborted": ("counter", "Requests abandoned before finishing (client gone).", {}, ()),
    "jido:kv_pinned_prefixes": ("gauge", "Prefixes pinned with POST /v1/cache.", {}, ()),
    "jido:kv_pinned_bytes": ("gauge", "KV bytes the pinned prefixes hold in the device pool.", {}, ()),
    "jido:kv_pinned_tokens": ("gauge", "Tokens whose KV the pinned prefixes hold.", {}, ()),
    "jido:kv_pinned_hits": ("counter", "Requests admitted whose cached prefix covered a pinned one.", {}, ()),
    "jido:kernel_fallbacks": ("gauge", "C++ kernel libraries that failed to build, whose slower PyTorch fallbacks run "
                              "instead (`jido build-kernels` rebuilds them and keeps the compiler's output).", {}, ()),
}


@pytest.fixture
def fresh_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_DIR_ENV, raising=False)


@pytest.fixture
def metrics(fresh_env: None) -> Iterator[ServerMetrics]:
    metrics = ServerMetrics("m", max_model_len=600)
    yield metrics
    metrics.close()


def _text(metrics: ServerMetrics) -> str:
    return metrics.render().decode()


def _families(text: str) -> dict[str, tuple]:
    """The BEFORE shape of an exposition, read with prometheus_client's own parser."""
    families = {}
    for family in text_string_to_metric_families(text):
        labels = {key: tuple(sorted({s.labels[key] for s in family.samples}))
                  for key in {k for s in family.samples for k in s.labels} - {"model_name", "le"}}
        bounds = {s.labels["le"] for s in family.samples if "le" in s.labels}
        buckets = tuple(sorted(float(b) for b in bounds - {"+Inf"}))
        # The old exporter wrote bounds as repr(float): le="5.0", le="0.0001"; they must read the same.
        assert bounds == ({repr(b) for b in buckets} | {"+Inf"} if buckets else set()), family.name
        families[family.name] = (family.type, family.documentation, labels, buckets)
    return families


def _exercise(metrics: ServerMetrics) -> None:
    """Every recording path once: an engine step, a two-output request that finishes, a rejection, an abort."""
    stats = SchedulerStats(num_running=1, kv_cache_usage=0.5, prefix_cache_queries=7, prefix_cache_hits=3,
                           num_preemptions=1)
    metrics.on_report(StepReport(IterationStats(0.001, 0.01, 0.001, 0.001, 7, (0.002,), num_reqs=2), stats, 1), 0)
    timer = RequestTimer()
    metrics.on_output(timer, RequestOutput("r", None, [1, 2, 3], [CompletionOutput(0, "a", [5], None, None, None)]))
    metrics.on_output(timer, RequestOutput("r", None, [1, 2, 3],
                                           [CompletionOutput(0, "abc", [5, 6, 7], None, None, "length")], True))
    metrics.on_rejected("overload")
    metrics.on_aborted(2)


def test_exported_families_are_the_ones_the_hand_written_exporter_had(metrics):
    assert _families(_text(metrics)) == BEFORE  # fresh: every series already there
    _exercise(metrics)
    assert _families(_text(metrics)) == BEFORE


def test_every_series_is_exported_at_zero_before_any_request(metrics):
    parsed = parse_metrics(_text(metrics))
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert parsed.samples[name] == [({"model_name": "m"}, 0.0)], name
    assert parsed.samples["vllm:request_success_total"] == [
        ({"model_name": "m", "finished_reason": reason}, 0.0) for reason in ("stop", "length", "abort")]
    assert parsed.samples["jido:requests_rejected_total"] == [
        ({"model_name": "m", "reason": reason}, 0.0) for reason in ("overload", "stopped")]
    assert parsed.total("vllm:time_to_first_token_seconds_count") == 0
    assert parsed.total("jido:step_time_seconds_count") == 0
    assert {labels["phase"] for labels, _ in parsed.samples["jido:step_time_seconds_count"]} == {
        "schedule", "prepare", "model", "sample", "propose", "update"}


def test_recorded_values_read_back_through_the_exposition(metrics):
    _exercise(metrics)
    # The scheduler's running totals become counter increments: 10 more queries, 0 more hits, same preemptions.
    stats = SchedulerStats(prefix_cache_queries=17, prefix_cache_hits=3, num_preemptions=1)
    metrics.on_report(StepReport(None, stats, 1), 4)
    parsed = parse_metrics(_text(metrics))
    assert [(name, parsed.total(name)) for name in (
        "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions", "vllm:prompt_tokens",
        "vllm:generation_tokens", "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc", "jido:requests_aborted")] == [
        ("vllm:prefix_cache_queries", 17), ("vllm:prefix_cache_hits", 3), ("vllm:num_preemptions", 1),
        ("vllm:prompt_tokens", 3), ("vllm:generation_tokens", 3), ("vllm:num_requests_running", 0),
        ("vllm:num_requests_waiting", 4), ("vllm:kv_cache_usage_perc", 0), ("jido:requests_aborted", 1)]
    success = {labels["finished_reason"]: v for labels, v in parsed.samples["vllm:request_success_total"]}
    assert success == {"stop": 0, "length": 1, "abort": 2}  # the aborted request's two sequences
    rejected = {labels["reason"]: v for labels, v in parsed.samples["jido:requests_rejected_total"]}
    assert rejected == {"overload": 1, "stopped": 0}
    assert parsed.total("vllm:request_queue_time_seconds_sum") == pytest.approx(0.002)
    assert parsed.total("jido:step_tokens_sum") == 7 and parsed.total("vllm:request_prompt_tokens_sum") == 3
    assert parsed.total("jido:step_num_requests_sum") == 2 and parsed.total("jido:step_num_requests_count") == 1
    assert parsed.total("vllm:inter_token_latency_seconds_count") == 2  # two tokens arrived together


def test_histograms_export_cumulative_buckets_and_escape_label_values(fresh_env):
    metrics = ServerMetrics('my "model"', max_model_len=100)
    try:
        for seconds in (0.003, 0.03, 3.0):
            metrics.ttft.observe(seconds)
        text = _text(metrics)
    finally:
        metrics.close()
    parsed = parse_metrics(text)
    buckets = {labels["le"]: v for labels, v in parsed.samples["vllm:time_to_first_token_seconds_bucket"]}
    assert (buckets["0.001"], buckets["0.005"], buckets["0.04"], buckets["5.0"], buckets["+Inf"]) == (0, 1, 2, 3, 3)
    assert parsed.total("vllm:time_to_first_token_seconds_sum") == pytest.approx(3.033)
    assert parsed.total("vllm:time_to_first_token_seconds_count") == 3
    assert 'vllm:prompt_tokens_total{model_name="my \\"model\\""} 0.0' in text.splitlines()


def test_counters_are_typed_under_their_total_name_and_keep_their_colons(metrics):
    # As prometheus_client and vLLM write them: Prometheus files the samples under the TYPE line's name.
    lines = _text(metrics).splitlines()
    assert lines[lines.index("# TYPE vllm:prompt_tokens_total counter") + 1] == (
        'vllm:prompt_tokens_total{model_name="m"} 0.0')
    assert not [line for line in lines if line.startswith(("vllm_", "jido_"))]


def test_a_temporary_multiproc_dir_is_made_per_server_and_removed_at_close(fresh_env):
    first, second = ServerMetrics("m", 100), None
    try:
        assert os.environ[MULTIPROC_DIR_ENV] == first.dir.path
        assert sorted(os.listdir(first.dir.path)) == [
            f"counter_{os.getpid()}.db", f"gauge_livemostrecent_{os.getpid()}.db", f"histogram_{os.getpid()}.db"]
        first.on_aborted(1)
        second = ServerMetrics("m", 100)  # a second server in the same process starts from zero
        assert second.dir.path != first.dir.path and os.environ[MULTIPROC_DIR_ENV] == second.dir.path
        assert parse_metrics(_text(second)).total("jido:requests_aborted") == 0
        assert parse_metrics(_text(first)).total("jido:requests_aborted") == 1
        second.close()
        assert not os.path.exists(second.dir.path) and os.environ[MULTIPROC_DIR_ENV] == first.dir.path
    finally:
        first.close()
        if second is not None:
            second.close()
    assert not os.path.exists(first.dir.path) and MULTIPROC_DIR_ENV not in os.environ
    first.on_aborted(1)  # a request that ends after shutdown records nothing, and does not fail


def test_a_users_multiproc_dir_is_used_and_kept(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv(MULTIPROC_DIR_ENV, str(tmp_path))
    metrics = ServerMetrics("m", 100)
    metrics.on_aborted(1)
    metrics.close()
    assert metrics.dir.path == str(tmp_path) and os.environ[MULTIPROC_DIR_ENV] == str(tmp_path)
    # Counters stay for whoever reads the directory; the live gauges of this process are gone.
    assert sorted(os.listdir(tmp_path)) == [f"counter_{os.getpid()}.db", f"histogram_{os.getpid()}.db"]
    assert "wipe it between runs" in caplog.text


def test_a_worker_process_adds_its_counts_to_the_servers(metrics):
    metrics.engine_counters["num_preemptions"].inc(2)
    metrics.running.set(3)
    # What an engine process would do: it inherits the directory and records under the same names.
    worker = ("from prometheus_client import Counter, Gauge\n"
              "Counter('vllm:num_preemptions', 'h', ['model_name']).labels(model_name='m').inc(5)\n"
              "Gauge('vllm:num_requests_running', 'h', ['model_name'], multiprocess_mode='livemostrecent')"
              ".labels(model_name='m').set(7)\n")
    subprocess.run([sys.executable, "-c", worker], check=True, timeout=60)
    parsed = parse_metrics(_text(metrics))
    assert parsed.total("vllm:num_preemptions") == 7  # counters add up over processes
    assert parsed.samples["vllm:num_requests_running"] == [({"model_name": "m"}, 7.0)]  # the latest reading


def test_speculative_decoding_counters_follow_the_schedulers_totals_by_position(fresh_env):
    metrics = ServerMetrics("m", 100, num_speculative_tokens=3)
    try:
        parsed = parse_metrics(_text(metrics))
        assert parsed.samples["vllm:spec_decode_num_accepted_tokens_per_pos_total"] == [
            ({"model_name": "m", "position": str(p)}, 0.0) for p in range(3)]
        for drafts, tokens, accepted, per_pos in ((2, 5, 3, (2, 1)), (4, 11, 6, (4, 1, 1))):
            stats = SchedulerStats(spec_decoding=SpecDecodingStats(drafts, tokens, accepted, per_pos))
            metrics.on_report(StepReport(None, stats, 1), 0)
        parsed = parse_metrics(_text(metrics))
        assert [parsed.total(f"vllm:spec_decode_num_{name}") for name in ("drafts", "draft_tokens", "accepted_tokens")
                ] == [4, 11, 6]
        per_pos = {labels["position"]: v for labels, v in
                   parsed.samples["vllm:spec_decode_num_accepted_tokens_per_pos_total"]}
        assert per_pos == {"0": 4, "1": 1, "2": 1}
    finally:
        metrics.close()


def test_a_server_that_does_not_speculate_exports_no_speculative_decoding_series(metrics):
    assert not [name for name in parse_metrics(_text(metrics)).samples if "spec_decode" in name]


def test_kernel_libraries_on_their_fallbacks_are_counted_and_named(fresh_env):
    built = ServerMetrics("m", 100)
    failed = None
    try:
        assert parse_metrics(_text(built)).samples["jido:kernel_fallbacks"] == [({"model_name": "m"}, 0.0)]
        assert "jido:kernel_fallback_info" not in _text(built)
        built.close()
        failed = ServerMetrics("m", 100, kernel_fallbacks={"jido_int8_dot": "the float kernels (CalledProcessError)"})
        parsed = parse_metrics(_text(failed))
        assert parsed.total("jido:kernel_fallbacks") == 1
        assert parsed.samples["jido:kernel_fallback_info"] == [
            ({"model_name": "m", "library": "jido_int8_dot", "fallback": "the float kernels (CalledProcessError)"}, 1.0)]
    finally:
        (failed or built).close()
