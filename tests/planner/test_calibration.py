"""`jido plan --calibrate`: a ring all-reduce fit recovers the link it was made from, and the catalog then plans
tensor parallelism on a device it had none for."""
from __future__ import annotations

import json

import pytest

from jido.planner.calibration import apply_calibration, fit_ring_all_reduce, read_calibration, save_calibration
from jido.planner.catalog import load_catalog
from jido.planner.cli import plan_main
from jido.planner.parallelism import ring_all_reduce_s


def test_the_fit_recovers_latency_and_bandwidth_from_exact_ring_samples():
    samples = [{"bytes": b, "seconds": ring_all_reduce_s(b, 2, link_gb_s=0.8, latency_us=30.0)}
               for b in (2_560, 20_480, 81_920)]
    fit = fit_ring_all_reduce("cpu-2core", 2, samples)
    assert fit.latency_us == pytest.approx(30.0) and fit.gb_s == pytest.approx(0.8)
    assert fit.max_error == pytest.approx(0.0, abs=1e-9)


def test_one_size_or_a_shrinking_time_is_refused():
    with pytest.raises(ValueError, match="at least two sizes"):
        fit_ring_all_reduce("cpu-2core", 2, [{"bytes": 10, "seconds": 1e-4}] * 3)
    with pytest.raises(ValueError, match="time does not grow with size"):
        fit_ring_all_reduce("cpu-2core", 2, [{"bytes": 10, "seconds": 2e-4}, {"bytes": 1000, "seconds": 1e-4}])


def test_a_calibrated_device_gets_the_fitted_link_and_degree(tmp_path):
    path = tmp_path / "calibration.json"
    save_calibration(fit_ring_all_reduce("cpu-2core", 2, [{"bytes": 1e3, "seconds": 1e-4},
                                                          {"bytes": 1e5, "seconds": 3e-4}]), path)
    cpu = apply_calibration(load_catalog(), read_calibration(path)).accelerator("cpu-2core")
    assert cpu.max_tp == 2 and cpu.scaleup_gb_s == pytest.approx(99_000 / 2e-4 / 1e9)  # (2 hops / TP2) / slope
    assert "calibrated" in cpu.source["links"]
    assert load_catalog().accelerator("cpu-2core").max_tp == 1  # the catalog file itself is untouched


def test_plan_calibrate_then_explain_at_tp2(tmp_path, capsys):
    measured, kept = tmp_path / "measured.json", tmp_path / "kept.json"
    measured.write_text(json.dumps({"accelerator": "cpu-2core", "tp": 2, "samples": [
        {"bytes": 2_560, "seconds": 1e-4}, {"bytes": 81_920, "seconds": 3e-4}]}))
    assert plan_main(["--calibrate", str(measured), "--calibration-file", str(kept)]) == 0
    assert "cpu-2core TP2 link:" in capsys.readouterr().out
    plan_main(["--model", "gemma-3-270m", "--explain", "pool=cpu-2core,kv=hbm", "--tensor-parallel-size", "2",
               "--calibration-file", str(kept), "--rate", "0.1"])
    assert "TP2, 36 all-reduces per step" in capsys.readouterr().out
