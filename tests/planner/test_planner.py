from __future__ import annotations

import json

import pytest

from jido.planner.cli import plan_main
from jido.planner.design_space import SearchSpace
from jido.planner.model_shapes import CATALOG
from jido.planner.planner import pareto_front, plan
from jido.planner.sizing import PlanInputs
from jido.planner.workloads import WORKLOADS

NARROW = dict(accelerators=("L40S", "A10"), weight_precisions=("fp8", "int8"), kv_precisions=("fp8",),
              links=("infiniband",), wires=("raw",), residencies=("hbm",), ownerships=("pull",))


def _plan(catalog, settings, **space):
    rag = WORKLOADS["rag"]
    inputs = PlanInputs(CATALOG["llama-3.1-8b"], rag, rag.slo, rag.rate, catalog)
    return plan(inputs, SearchSpace(**{**NARROW, **space}), settings)


def test_heterogeneous_prefill_on_l40s_decode_on_a10_saves_over_homogeneous_split(catalog, fast_settings):
    result = _plan(catalog, fast_settings, placements=("disaggregated",))
    saving = result.saving
    assert saving.heterogeneous.config.label.startswith("p=L40S:fp8:fp8,d=A10:int8:fp8")
    assert saving.percent == pytest.approx(
        100 * (1 - saving.heterogeneous.cost_per_mtok / saving.homogeneous.cost_per_mtok))
    assert saving.percent > 5
    assert saving.explanation.startswith(f"heterogeneous saves {saving.percent:.1f}% per token; prefill on L40S")


def test_when_a_homogeneous_pool_is_cheapest_the_report_says_no_saving(catalog, fast_settings):
    result = _plan(catalog, fast_settings)
    assert result.ranked[0].config.label == "pool=L40S:fp8:fp8,kv=hbm"
    assert result.saving.percent is None
    assert result.saving.explanation.startswith("no saving: the best heterogeneous design costs")


def test_ranked_configurations_meeting_the_slo_come_first_cheapest_first(catalog, fast_settings):
    ranked = _plan(catalog, fast_settings).ranked
    meeting = [r for r in ranked if r.meets_slo]
    assert ranked[: len(meeting)] == meeting
    assert [r.cost_per_mtok for r in meeting] == sorted(r.cost_per_mtok for r in meeting)


def test_pareto_front_keeps_only_undominated_points():
    points = [(1.0, 9.0), (2.0, 5.0), (2.5, 6.0), (3.0, 1.0), (4.0, 1.0)]
    assert pareto_front(points) == [0, 1, 3]


def _run_cli(capsys, argv):
    code = plan_main(argv)
    return code, capsys.readouterr()


FAST = ["--num-requests", "60", "--num-finalists", "1", "--max-ratio-tries", "2",
        "--accelerators", "L40S,A10", "--weight-precisions", "fp8,int8", "--kv-precisions", "fp8",
        "--links", "infiniband", "--wires", "raw", "--residencies", "hbm", "--ownerships", "push"]


def test_plan_json_has_the_numbers_a_script_needs(capsys):
    code, out = _run_cli(capsys, ["--model", "llama-3.1-8b", "--workload", "rag", "--slo", "ttft=1500,tpot=50",
                                  "--rate", "4", "--json", *FAST])
    data = json.loads(out.out)
    assert code == 0
    assert data["kv_bytes_per_token"] == 131072
    assert data["slo"] == {"ttft_ms": 1500.0, "tpot_ms": 50.0}
    config = data["configurations"][0]
    assert {"config", "ratio", "num_prefill", "num_decode", "cost_per_hour", "cost_per_mtok", "ttft_ms", "tpot_ms",
            "slo_attainment", "meets_slo", "link_needed_gb_s", "link_available_gb_s", "heterogeneous",
            "prefill_utilization", "decode_utilization"} <= set(config)
    assert set(config["ttft_ms"]) == {"p50", "p90", "p99"}
    assert {"percent", "explanation", "heterogeneous", "homogeneous"} <= set(data["saving"])
    assert {"reason", "count", "example"} == set(data["search"]["pruned"][0])


def test_plan_explain_shows_the_arithmetic(capsys):
    label = "p=H100-SXM,d=A100-80G,link=infiniband"
    code, out = _run_cli(capsys, ["--workload", "chat", "--explain", label, "--num-requests", "40", "--json"])
    data = json.loads(out.out)
    steps = {s["what"]: s for s in data["steps"]}
    assert code == 0 and data["verdict"] in ("meets the SLOs", "misses the SLOs")
    assert steps["KV bytes per token (16-bit)"]["value"] == "131,072 B"
    assert "GB/s needed vs 50.0 GB/s available" in steps["link bandwidth"]["value"]
    assert "simulated" in data


def test_plan_explain_of_a_pruned_config_says_why(capsys):
    code, out = _run_cli(capsys, ["--explain", "p=L4,d=A10,link=nvlink"])
    assert code == 0
    assert "pruned: different accelerator types sit on different servers" in out.out


def test_plan_writes_a_pareto_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "pareto.png"
    code, _ = _run_cli(capsys, ["--workload", "rag", "--pareto", str(png), *FAST])
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_are_reported_not_raised(capsys):
    code, out = _run_cli(capsys, ["--price", "H100-SXM", *FAST])
    assert code == 2
    assert "expected ACCELERATOR=USD_PER_HOUR" in out.err
