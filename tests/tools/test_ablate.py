"""`jido ablate` without a model: medians, gains and the order against hand-computed values; the plan from serve's
flags; the runner against the fake OpenAI server (same prompts everywhere, refusals, Ctrl-C)."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from fake_openai_server import FakeState, fake_server_running

from jido.tools.ablate import cli as ablate_cli
from jido.tools.ablate import runner as ablate_runner
from jido.tools.ablate.config import AblateConfig
from jido.tools.ablate.report import format_order, format_table
from jido.tools.ablate.results import (Ablation, Arm, Step, application_order, beats, gain, median, ratio,
                                       spread)
from jido.tools.ablate.runner import plan
from jido.tools.ablate.serve import ServerStartError, serve_options
from jido.tools.ablate.techniques import TECHNIQUES, Setting, Technique, missing, select


def arm(technique: str | None, value: str, *throughputs: float, **other: float) -> Arm:
    """An arm whose runs had these output throughputs (and the same other metrics each)."""
    return Arm(technique, value, (), [{"output_throughput": t, "failed": 0, **other} for t in throughputs])


def test_medians_spreads_and_ratios_match_hand_computed_values():
    assert median([3.0, 1.0, None, 2.0]) == 2.0 and median([4.0, 1.0, 3.0, 2.0]) == 2.5 and median([None]) is None
    assert spread([3.0, 1.0, 2.0]) == [1.0, 3.0] and spread([]) is None
    assert ratio(3.0, 2.0) == 1.5 and ratio(1.0, 0.0) is None and ratio(None, 2.0) is None
    both = arm(None, "baseline", 90.0, 110.0, 100.0)
    assert both.medians()["output_throughput"] == 100.0 and both.spreads()["output_throughput"] == [90.0, 110.0]


def test_gain_is_above_one_when_better_whichever_way_the_metric_points():
    assert gain(arm("t", "on", 120.0), arm("t", "off", 100.0), "output_throughput") == pytest.approx(1.2)
    fast, slow = arm("t", "on", 1.0, p99_ttft_ms=50.0), arm("t", "off", 1.0, p99_ttft_ms=100.0)
    assert gain(fast, slow, "p99_ttft_ms") == pytest.approx(2.0)


@pytest.mark.parametrize("on, off, pays", [
    ((104.0,), (100.0,), False),  # under min_gain
    ((110.0,), (100.0,), True),
    ((108.0, 110.0, 112.0), (100.0, 109.0, 111.0), False),  # a 10% median gain, but the runs overlap
    ((112.0, 115.0, 118.0), (100.0, 105.0, 111.0), True),
])
def test_a_technique_pays_beyond_min_gain_and_the_spread_of_its_runs(on, off, pays):
    assert beats(arm("t", "on", *on), arm("t", "off", *off), "output_throughput", 0.05) is pays


def test_a_value_with_failed_requests_never_pays_and_goodput_from_nothing_does():
    failing = Arm("t", "on", (), [{"output_throughput": 500.0, "failed": 1}])
    assert not beats(failing, arm("t", "off", 100.0), "output_throughput", 0.05)
    assert beats(arm("t", "on", 1.0, request_goodput=0.5), arm("t", "off", 1.0, request_goodput=0.0),
                 "request_goodput", 0.05)


def test_among_values_that_score_where_off_scored_nothing_the_best_is_chosen():
    technique = TECHNIQUES["kv-cache-dtype"]
    arms = {("kv-cache-dtype", value): arm("kv-cache-dtype", value, 1.0, request_goodput=goodput)
            for value, goodput in (("auto", 0.0), ("int8", 0.5), ("fp8_e4m3", 0.8), ("fp8_e5m2", 0.0))}
    paid, _ = application_order([technique], arms, "request_goodput", 0.05)
    assert [(s.value, s.gain) for s in paid] == [("fp8_e4m3", None)]


def example_arms() -> tuple[list[Technique], dict[tuple[str, str], Arm]]:
    """The baseline at 100 tok/s (continuous, chunked prefill, prefix caching, gguf, auto KV) and variants."""
    techniques = select("batching,chunked-prefill,prefix-caching,quantization,kv-cache-dtype")
    baseline = arm(None, "baseline", 100.0)
    arms = {(t.name, t.baseline): baseline for t in techniques}
    for (name, value), throughput in {("batching", "static"): 50.0, ("batching", "dynamic"): 60.0,
                                      ("chunked-prefill", "off"): 90.0, ("prefix-caching", "off"): 80.0,
                                      ("quantization", "none"): 90.0, ("quantization", "int8"): 120.0,
                                      ("quantization", "int4"): 70.0, ("kv-cache-dtype", "int8"): 102.0,
                                      ("kv-cache-dtype", "fp8_e4m3"): 99.0}.items():
        arms[(name, value)] = arm(name, value, throughput)
    return techniques, arms


def test_techniques_that_paid_come_in_seed_004s_stage_order_with_their_best_value_and_gain():
    techniques, arms = example_arms()
    paid, unpaid = application_order(techniques, arms, "output_throughput", 0.05)
    # prefix caching (1.25x) comes before quantization (1.33x): stages first, then the larger gain.
    assert [(s.technique, s.value, round(s.gain, 3), s.is_baseline) for s in paid] == [
        ("batching", "continuous", 2.0, True), ("chunked-prefill", "on", 1.111, True),
        ("prefix-caching", "on", 1.25, True), ("quantization", "int8", 1.333, False)]
    assert unpaid == [Step("quantization", "kv-cache-dtype", "int8", pytest.approx(1.02), False)]


def test_the_order_text_names_each_stage_and_gain_and_what_did_not_pay():
    techniques, arms = example_arms()
    variants = [a for key, a in arms.items() if a.technique is not None]
    ablation = Ablation(techniques, arms[("batching", "continuous")], variants,
                        [{"technique": "speculative", "value": "ngram-4", "reason": "jido serve has no flag"}])
    paid, unpaid = application_order(techniques, arms, "output_throughput", 0.05)
    from jido.tools.ablate.report import Summary

    text = format_order(ablation, Summary("output_throughput", paid, unpaid, None), 0.05)
    assert "  1. batching/scheduler knobs: batching=continuous 2.00x (jido's default), chunked-prefill=on 1.11x" \
           " (jido's default)" in text
    assert "  3. quantization: quantization=int8 1.33x (jido's default is gguf)" in text
    assert "  4. speculative decoding: nothing paid" in text
    assert "Did not pay (under 5%, within the spread of the runs, or with failed requests): " \
           "kv-cache-dtype=int8 1.02x" in text
    assert "Unavailable: speculative=ngram-4 (jido serve has no flag)" in text
    table = format_table(ablation)
    assert "baseline" in table.splitlines()[1] and "100.0 (100.0-100.0)" in table.splitlines()[1]
    static_row = next(line for line in table.splitlines() if line.startswith("batching") and "static" in line)
    assert "50.0 (50.0-50.0)" in static_row and "0.50x" in static_row


SERVE_OPTIONS = {"--model": None, "--kv-cache-memory": None, "--scheduling-mode": ("continuous", "dynamic", "static"),
                 "--enable-prefix-caching": None, "--no-enable-prefix-caching": None, "--speculative-config": None,
                 "--kv-cache-dtype": ("auto", "int8")}


def test_the_plan_runs_what_serve_has_and_reports_the_rest_unavailable():
    config = AblateConfig(model="m", serve_args="--kv-cache-memory 1GiB",
                          techniques="batching,prefix-caching,speculative,kv-cache-dtype,data-parallel")
    ablation = plan(config, SERVE_OPTIONS)
    common = ("--model", "m", "--kv-cache-memory", "1GiB")
    assert ablation.baseline.serve_args == (*common, "--scheduling-mode", "continuous", "--enable-prefix-caching",
                                            "--kv-cache-dtype", "auto")
    assert [a.label for a in ablation.variants] == ["batching=static", "batching=dynamic", "prefix-caching=off",
                                                    "kv-cache-dtype=int8", "speculative=ngram-4"]
    # A variant's own flags come after the baseline's, so its value wins.
    assert ablation.variants[2].serve_args == (*ablation.baseline.serve_args, "--no-enable-prefix-caching")
    assert ablation.unavailable == [
        {"technique": "kv-cache-dtype", "value": "fp8_e4m3", "reason": "jido serve --kv-cache-dtype takes auto, int8, "
                                                                        "not fp8_e4m3"},
        {"technique": "kv-cache-dtype", "value": "fp8_e5m2", "reason": "jido serve --kv-cache-dtype takes auto, int8, "
                                                                        "not fp8_e5m2"},
        {"technique": "data-parallel", "value": "2", "reason": "jido serve has no --data-parallel-size flag"},
        {"technique": "data-parallel", "value": "2-round-robin", "reason": "jido serve has no --data-parallel-size flag"}]


def test_serve_options_are_read_from_this_jidos_serve_help():
    options = serve_options()
    assert options["--scheduling-mode"] == ("continuous", "dynamic", "static")
    assert options["--quantization"] == ("none", "gguf", "gguf_w8a8", "int8", "int4", "w8a8", "fp8")
    assert "--no-enable-chunked-prefill" in options and options["--model"] is None
    assert missing(TECHNIQUES["batching"].setting("dynamic").serve_args, options) is None


def test_unknown_techniques_and_bad_settings_are_refused_with_what_is_allowed():
    with pytest.raises(ValueError, match=r"unknown technique\(s\) \['prefix-cache'\]; known: batching, "):
        select("prefix-cache")
    with pytest.raises(ValueError, match="baseline 'on' is none of its values"):
        Technique("t", "scheduler", "", (Setting("off"), Setting("1")), "on")
    with pytest.raises(ValueError, match="serve_args"):
        AblateConfig(serve_args="--model 'unclosed")
    with pytest.raises(ValueError, match="gain_metric must be one of completed, failed, .*, got 'speed'"):
        AblateConfig(gain_metric="speed")


# -- the runner, against the fake server ------------------------------------------------------------------
@pytest.fixture
def fake_serving(monkeypatch: pytest.MonkeyPatch):
    """`jido serve` replaced by the fake OpenAI server: every start records its flags (``starts``); a start
    whose flags contain a key of ``refuse`` raises that, as a server that will not start; one whose flags
    contain a key of ``slow`` answers /metrics that many seconds late."""
    state = FakeState()
    starts: list[tuple[str, ...]] = []
    refuse: dict[str, BaseException] = {}
    slow: dict[str, float] = {}

    @contextlib.contextmanager
    def serving(serve_args, log_path, start_timeout_s):
        starts.append(tuple(serve_args))
        for flag, error in refuse.items():
            if flag in serve_args:
                raise error
        state.metrics_delay_s = max([delay for flag, delay in slow.items() if flag in serve_args], default=0.0)
        with fake_server_running(state) as base_url:
            yield base_url

    monkeypatch.setattr(ablate_runner, "serving", serving)
    monkeypatch.setattr(ablate_cli, "serve_options", lambda: SERVE_OPTIONS)
    return state, starts, refuse, slow


def ablate(tmp_path: Path, *extra: str) -> tuple[int, dict]:
    result = tmp_path / "ablate.json"
    status = ablate_cli.ablate_main(["--dataset-name", "random", "--num-prompts", "3", "--random-input-len", "8",
                                     "--random-output-len", "3", "--max-concurrency", "2", "--disable-tqdm",
                                     "--no-plots", "--result-file", str(result), *extra])
    return status, json.loads(result.read_text()) if result.exists() else {}


def test_every_server_gets_the_same_prompts_after_warm_ups_that_are_not_among_them(tmp_path, fake_serving):
    state, starts, _, _ = fake_serving
    status, result = ablate(tmp_path, "--techniques", "prefix-caching", "--repeats", "2", "--num-warmups", "2")
    assert status == 0 and len(starts) == 4  # baseline and prefix-caching=off, twice, one at a time
    # Each server: the warm-up run (the bench's first request, then 2 warm-ups), then the timed run (the bench's
    # first request, then the 3 prompts).
    prompts = [p["prompt"] for p in state.payloads]
    assert len(prompts) == 4 * 7
    warmups, timed = [set(prompts[i * 7 + 1:i * 7 + 3]) for i in range(4)], [set(prompts[i * 7 + 4:i * 7 + 7])
                                                                              for i in range(4)]
    assert all(t == timed[0] for t in timed) and len(timed[0]) == 3 and not warmups[0] & timed[0]
    assert len(result["baseline_runs"]) == 2 and len(result["variants"][0]["runs"]) == 2
    variant = result["variants"][0]
    assert (variant["technique"], variant["value"]) == ("prefix-caching", "off")
    for key, value in variant["metrics"].items():
        if value is not None and result["baseline"][key]:
            assert variant["ratios"][key] == pytest.approx(value / result["baseline"][key]), key
    assert result["baseline"]["completed"] == 3 and result["interrupted"] is False


def test_a_variant_whose_server_will_not_start_is_unavailable_with_its_reason(tmp_path, fake_serving):
    _, _, refuse, _ = fake_serving
    refuse["--speculative-config"] = ServerStartError("jido serve exited with 2 before listening: jido: error: no")
    status, result = ablate(tmp_path, "--techniques", "speculative", "--repeats", "2")
    assert status == 0 and result["variants"] == []
    assert result["unavailable"] == [{"technique": "speculative", "value": "ngram-4", "reason": pytest.approx(
        "jido serve exited with 2 before listening: jido: error: no (log: "
        f"{tmp_path / 'ablate-logs' / '002-speculative=ngram-4-r1.log'})")}]
    assert len(result["baseline_runs"]) == 2


def test_a_baseline_that_will_not_start_stops_the_ablation_with_its_reason(tmp_path, fake_serving, capsys):
    _, _, refuse, _ = fake_serving
    refuse["--model"] = ServerStartError("jido serve exited with 1 before listening: no such model")
    status, _ = ablate(tmp_path, "--techniques", "prefix-caching", "--model", "missing.gguf")
    assert status == 2 and "the baseline server" in capsys.readouterr().err


def test_ctrl_c_keeps_and_writes_the_runs_measured_so_far(tmp_path, fake_serving):
    _, starts, refuse, _ = fake_serving
    refuse["--no-enable-prefix-caching"] = KeyboardInterrupt()
    status, result = ablate(tmp_path, "--techniques", "prefix-caching,batching", "--repeats", "1")
    assert status == 130 and result["interrupted"] is True
    # baseline, batching=static, batching=dynamic, then the interrupted prefix-caching=off start.
    assert len(starts) == 4 and len(result["baseline_runs"]) == 1
    assert {(v["value"], len(v["runs"])) for v in result["variants"]} == {("static", 1), ("dynamic", 1), ("off", 0)}


def test_a_value_that_runs_past_the_run_timeout_is_recorded_and_not_run_again(tmp_path, fake_serving, capsys):
    _, starts, _, slow = fake_serving
    slow["static"] = 3.0
    status, result = ablate(tmp_path, "--techniques", "batching", "--repeats", "2", "--run-timeout-s", "1")
    assert status == 0
    # Round 1: baseline, static (timed out), dynamic; round 2 without static.
    assert [dict(zip(s[::2], s[1::2]))["--scheduling-mode"] for s in starts] == [
        "continuous", "static", "dynamic", "continuous", "dynamic"]
    static = next(v for v in result["variants"] if v["value"] == "static")
    assert static["runs"] == [] and static["errors"][0].startswith("warm-up and run took longer than 1 s")
    assert "batching=static: 1 run(s) failed: warm-up and run took longer than 1 s" in capsys.readouterr().out
