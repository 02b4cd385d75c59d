from __future__ import annotations

import functools
import http.server
import json
import threading

import pytest

from jido.planner.cli import doctor_main
from jido.planner.doctor import Observations, diagnose, observations_from_bench, observations_from_metrics
from jido.planner.prometheus import parse_metrics

HEALTHY = dict(completed=500, request_throughput=8.0, output_throughput=2000.0, mean_ttft_ms=180.0,
               p99_ttft_ms=420.0, mean_tpot_ms=22.0, p99_tpot_ms=30.0, p99_itl_ms=40.0, mean_queue_time_ms=5.0,
               kv_cache_usage=0.4, num_preemptions=0, prefix_cache_hit_rate=0.6, mean_input_len=900.0)


def _diagnose(**changes):
    return diagnose(Observations(**{**HEALTHY, **changes}))


def test_healthy_run_has_no_bottleneck():
    assert [f.name for f in _diagnose()] == ["healthy"]


def test_slow_first_token_on_long_prompts_without_prefix_reuse():
    top = _diagnose(mean_ttft_ms=2500.0, p99_ttft_ms=4000.0, mean_input_len=6000.0, prefix_cache_hit_rate=0.05)[0]
    assert top.name == "prefill-compute-no-prefix-reuse"
    assert "mean_input_len=6000" in top.evidence and "prefix_cache_hit_rate=0.05" in top.evidence
    assert any("--enable-prefix-caching" in k for k in top.knobs)


def test_slow_first_token_from_queueing():
    top = _diagnose(mean_ttft_ms=3000.0, p99_ttft_ms=5000.0, mean_queue_time_ms=2600.0, kv_cache_usage=0.7)[0]
    assert top.name == "prefill-queueing"
    assert "mean_queue_time_ms=2600" in top.evidence


def test_slow_token_to_token_on_long_contexts_suggests_fp8_kv():
    top = _diagnose(mean_tpot_ms=120.0, p99_tpot_ms=150.0, mean_input_len=8000.0, prefix_cache_hit_rate=0.8)[0]
    assert top.name == "slow-decode"
    assert top.knobs[0].startswith("--kv-cache-dtype fp8")


def test_preemptions_under_concurrency_point_at_kv_memory():
    findings = _diagnose(num_preemptions=120, kv_cache_usage=0.98, mean_tpot_ms=90.0, mean_ttft_ms=2000.0,
                         p99_ttft_ms=6000.0)
    assert findings[0].name == "kv-memory-pressure"
    assert "num_preemptions=120" in findings[0].evidence
    assert {"slow-decode"} <= {f.name for f in findings[1:]}


def test_long_queue_with_empty_kv_cache_is_a_batching_limit():
    top = _diagnose(num_requests_waiting=40, mean_queue_time_ms=1500.0, mean_ttft_ms=1700.0, p99_ttft_ms=2500.0,
                    kv_cache_usage=0.15, num_requests_running=8)[0]
    assert top.name == "batching-limit"
    assert any("--max-num-seqs" in k for k in top.knobs)


def test_good_throughput_bad_p99_is_tail_latency():
    top = _diagnose(mean_ttft_ms=150.0, p99_ttft_ms=900.0, p99_itl_ms=200.0)[0]
    assert top.name == "tail-latency"
    assert any("--max-num-batched-tokens" in k for k in top.knobs)


def test_bench_json_keys_and_derived_input_length():
    obs = observations_from_bench({"completed": 10, "total_input_tokens": 20000, "mean_ttft_ms": 100,
                                   "kv_cache_usage": 85, "date": "2026-01-01"})
    assert obs.mean_input_len == 2000 and obs.kv_cache_usage == 0.85 and obs.mean_ttft_ms == 100


def test_jido_bench_server_keys_are_read_where_the_plain_keys_are_missing():
    obs = observations_from_bench({"completed": 4, "server_mean_queue_time_ms": 1200.0,
                                   "server_max_kv_cache_usage": 0.3, "server_mean_kv_cache_usage": 0.1,
                                   "server_num_preemptions": 0, "server_prefix_cache_hit_rate": None,
                                   "server_mean_num_requests_waiting": 2.5, "num_requests_running": 3})
    assert (obs.mean_queue_time_ms, obs.kv_cache_usage, obs.num_preemptions, obs.prefix_cache_hit_rate,
            obs.num_requests_waiting, obs.num_requests_running) == (1200.0, 0.3, 0.0, None, 2.5, 3.0)
    assert diagnose(obs)[0].name == "batching-limit"  # queued while the KV cache peaked at 30%


METRICS = """\
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 10.0
vllm:time_to_first_token_seconds_bucket{le="1.0",model_name="m"} 50.0
vllm:time_to_first_token_seconds_bucket{le="5.0",model_name="m"} 90.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 100.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 180.0
vllm:time_to_first_token_seconds_count{model_name="m"} 100.0
vllm:inter_token_latency_seconds_bucket{le="0.05",model_name="m"} 900.0
vllm:inter_token_latency_seconds_bucket{le="+Inf",model_name="m"} 1000.0
vllm:inter_token_latency_seconds_sum{model_name="m"} 30.0
vllm:inter_token_latency_seconds_count{model_name="m"} 1000.0
vllm:num_requests_waiting{model_name="m"} 3.0
vllm:num_requests_running{model_name="m"} 12.0
vllm:kv_cache_usage_perc{model_name="m"} 0.97
vllm:num_preemptions_total{model_name="m"} 42.0
vllm:prefix_cache_queries_total{model_name="m"} 1000.0
vllm:prefix_cache_hits_total{model_name="m"} 250.0
vllm:request_success_total{finished_reason="stop",model_name="m"} 60.0
vllm:request_success_total{finished_reason="length",model_name="m"} 40.0
"""


def test_prometheus_histograms_counters_and_gauges():
    obs = observations_from_metrics(parse_metrics(METRICS))
    assert obs.mean_ttft_ms == pytest.approx(1800.0)
    # rank 99 lies in the (1, 5] bucket past 90: 5 s upper edge, so the +Inf bucket answers its lower bound
    assert obs.p99_ttft_ms == pytest.approx(5000.0)
    assert obs.mean_tpot_ms == pytest.approx(30.0)
    assert obs.kv_cache_usage == 0.97 and obs.num_preemptions == 42 and obs.completed == 100
    assert obs.prefix_cache_hit_rate == 0.25 and obs.num_requests_waiting == 3


def test_histogram_quantile_interpolates_inside_the_bucket():
    m = parse_metrics(METRICS)
    assert m.histogram_quantile("vllm:time_to_first_token_seconds", 0.7) == pytest.approx(1.0 + 4.0 * 20 / 40)


def test_doctor_reads_a_metrics_file(tmp_path, capsys):
    path = tmp_path / "metrics.txt"
    path.write_text(METRICS)
    assert doctor_main(["--metrics-file", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bottleneck"] == "kv-memory-pressure"
    assert data["observations"]["num_preemptions"] == 42


def test_doctor_fetches_metrics_from_127_0_0_1(tmp_path, capsys):
    (tmp_path / "metrics").write_text(METRICS)
    handler = functools.partial(_QuietHandler, directory=str(tmp_path))
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        assert doctor_main(["--metrics-url", url]) == 0
    finally:
        server.shutdown()
        server.server_close()
    out = capsys.readouterr().out
    assert out.startswith("bottleneck: kv-memory-pressure")
    assert "num_preemptions=42" in out


def test_doctor_reads_a_bench_result(tmp_path, capsys):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({**HEALTHY, "mean_tpot_ms": 95.0, "p99_tpot_ms": 120.0}))
    assert doctor_main([str(path), "--json", "--slo", "tpot=60"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bottleneck"] == "slow-decode" and data["slo"]["tpot_ms"] == 60.0
    assert {"name", "score", "root_cause", "summary", "evidence", "knobs"} == set(data["findings"][0])


def test_doctor_needs_exactly_one_source(capsys):
    with pytest.raises(SystemExit):
        doctor_main([])
    assert "give exactly one of" in capsys.readouterr().err


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_long_prompts_missing_the_cache_in_a_full_pool_suggest_offload_and_pinning():
    findings = _diagnose(mean_input_len=2000.0, prefix_cache_hit_rate=0.1, kv_cache_usage=0.95)
    evicted = next(f for f in findings if f.name == "prefixes-evicted")
    assert "prefix_cache_hit_rate=0.1" in evicted.evidence and "kv_cache_usage=0.95" in evicted.evidence
    assert evicted.knobs[0].startswith("--kv-offload") and "POST /v1/cache" in evicted.knobs[1]
    with_tiers = next(f for f in _diagnose(mean_input_len=2000.0, prefix_cache_hit_rate=0.1, kv_cache_usage=0.95,
                                           kv_offload_hit_rate=0.2) if f.name == "prefixes-evicted")
    assert with_tiers.knobs[0].startswith("raise the offload tiers' sizes")
    assert "prefixes-evicted" not in {f.name for f in _diagnose(mean_input_len=2000.0, prefix_cache_hit_rate=0.1)}


def test_offload_hit_rate_is_read_from_bench_deltas_and_metrics():
    bench = {"server_kv_offload": {"cpu": {"hits": 30, "misses": 10}, "remote": {"hits": 0, "misses": 10}}}
    assert observations_from_bench(bench).kv_offload_hit_rate == 0.6
    text = ('jido:kv_offload_hits_total{model_name="m",tier="cpu"} 3\n'
            'jido:kv_offload_misses_total{model_name="m",tier="cpu"} 1\n')
    assert observations_from_metrics(parse_metrics(text)).kv_offload_hit_rate == 0.75


def test_kernels_on_their_fallbacks_are_the_root_cause_named_before_the_latencies_they_slow():
    findings = _diagnose(kernel_fallbacks=1, mean_tpot_ms=400.0, p99_tpot_ms=500.0)
    assert [f.name for f in findings][:2] == ["kernels-missing", "slow-decode"]
    assert findings[0].root_cause and any("jido build-kernels" in knob for knob in findings[0].knobs)
    assert "kernel_fallbacks=1" in findings[0].evidence
    text = 'jido:kernel_fallbacks{model_name="m"} 2.0\n'
    assert observations_from_metrics(parse_metrics(text)).kernel_fallbacks == 2
    assert [f.name for f in _diagnose(kernel_fallbacks=0)] == ["healthy"]
