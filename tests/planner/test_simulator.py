"""P:D ratio directions the issue asks the simulator to reproduce, on small seeded traces."""

from __future__ import annotations

import pytest

from jido.planner.design_space import Config
from jido.planner.model_shapes import CATALOG
from jido.planner.planner import PlanSettings, simulate_ratio
from jido.planner.sizing import PlanInputs, Sizer
from jido.planner.workloads import Workload

PREFILL_HEAVY = Workload("prefill-heavy", 4000, 0.3, 200, 0.5, 0.0, ttft_ms=2000, tpot_ms=100, rate=5)
SETTINGS = PlanSettings(num_requests=200, seed=1)


def _run(catalog, workload, label, p, d, settings=SETTINGS):
    inputs = PlanInputs(CATALOG["llama-3.1-8b"], workload, workload.slo, workload.rate, catalog)
    sizing = Sizer(inputs).size(Config.parse(label))
    assert sizing.feasible, sizing.reason
    return simulate_ratio(inputs, sizing, p, d, settings)


@pytest.fixture(scope="module")
def ratios(catalog):
    label = "p=L40S,d=L40S,link=infiniband"
    return {pd: _run(catalog, PREFILL_HEAVY, label, *pd) for pd in ((1, 3), (2, 2), (3, 1))}


def test_too_few_prefill_nodes_fails_the_ttft_slo(ratios):
    one_p = ratios[(1, 3)]
    assert not one_p.meets_slo
    assert one_p.sim.ttft_ms["p90"] > PREFILL_HEAVY.ttft_ms
    assert one_p.sim.tpot_ms["p90"] < PREFILL_HEAVY.tpot_ms  # decode is not the problem


def test_balanced_ratio_meets_both_slos(ratios):
    assert ratios[(2, 2)].meets_slo
    assert ratios[(2, 2)].sim.ttft_ms["p90"] < ratios[(1, 3)].sim.ttft_ms["p90"] / 5


def test_more_prefill_nodes_starve_decode_and_can_worsen_ttft(ratios):
    balanced, prefill_rich = ratios[(2, 2)], ratios[(3, 1)]
    # one decode node runs a bigger batch, and its full KV cache holds back new arrivals
    assert prefill_rich.sim.tpot_ms["p90"] > 1.4 * balanced.sim.tpot_ms["p90"]
    assert prefill_rich.sim.ttft_ms["p90"] > balanced.sim.ttft_ms["p90"]


def test_decode_heavy_workload_gains_little_from_splitting(catalog):
    decode_heavy = Workload("decode-heavy", 300, 0.3, 1000, 0.5, 0.0, ttft_ms=1000, tpot_ms=30, rate=4)
    settings = PlanSettings(num_requests=80, seed=1)
    pooled = _run(catalog, decode_heavy, "pool=H100-SXM", 1, 0, settings)
    split = _run(catalog, decode_heavy, "p=H100-SXM,d=H100-SXM,link=nvlink", 1, 1, settings)
    assert pooled.meets_slo and split.meets_slo
    assert split.sim.tpot_ms["p90"] == pytest.approx(pooled.sim.tpot_ms["p90"], rel=0.1)
    assert split.cost_per_hour == 2 * pooled.cost_per_hour


def test_prefill_heavy_colocation_inflates_tpot_that_splitting_removes(catalog):
    workload = Workload("prefill-heavy", 4000, 0.3, 200, 0.5, 0.0, ttft_ms=1000, tpot_ms=30, rate=12)
    pooled = _run(catalog, workload, "pool=H100-SXM", 3, 0)
    split = _run(catalog, workload, "p=H100-SXM,d=H100-SXM,link=nvlink", 2, 1)
    assert pooled.sim.tpot_ms["p90"] > 1.5 * split.sim.tpot_ms["p90"]


def test_same_seed_gives_the_same_result(catalog):
    a = _run(catalog, PREFILL_HEAVY, "p=L40S,d=L40S,link=infiniband", 2, 2, PlanSettings(num_requests=50, seed=3))
    b = _run(catalog, PREFILL_HEAVY, "p=L40S,d=L40S,link=infiniband", 2, 2, PlanSettings(num_requests=50, seed=3))
    assert a.sim == b.sim
