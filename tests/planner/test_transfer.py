from __future__ import annotations

import json

import pytest

from jido.planner.model_shapes import CATALOG
from jido.planner.roofline import Role, build_instance
from jido.planner.transfer import LinkPlan, link_verdict, required_link_gb_s


def _inst(catalog, accelerator, kv="bf16", weights="bf16"):
    return build_instance(CATALOG["llama-3.1-8b"], Role(accelerator, weights, kv), catalog.accelerator(accelerator),
                          catalog.residency("hbm"), catalog.efficiency, 4096)


def test_ten_times_1024_tokens_at_16_rps_needs_about_25_gb_s(catalog):
    kv_per_request = CATALOG["llama-3.1-8b"].kv_bytes(10 * 1024)
    needed = required_link_gb_s(kv_per_request, 16)
    assert needed == pytest.approx(21.47, abs=0.01)
    assert 20 <= needed <= 26


def test_nvlink_and_infiniband_carry_it_and_10_gb_s_pcie_cannot(catalog):
    needed = required_link_gb_s(CATALOG["llama-3.1-8b"].kv_bytes(10 * 1024), 16)
    a100, h100 = catalog.accelerator("A100-80G"), catalog.accelerator("H100-SXM")
    assert link_verdict(needed, catalog.link("nvlink").bandwidth_gb_s(a100, a100)) == "ok"
    assert link_verdict(needed, catalog.link("nvlink").bandwidth_gb_s(h100, h100)) == "ok"
    assert link_verdict(needed, catalog.link("infiniband").bandwidth_gb_s(h100, a100)) == "ok"
    assert catalog.link("pcie").gb_s == 10.0
    assert link_verdict(needed, catalog.link("pcie").bandwidth_gb_s(h100, a100)) == "insufficient"


def test_raw_transfer_time_is_bytes_over_bandwidth_plus_latency(catalog):
    plan = LinkPlan(catalog.link("infiniband"), catalog.wire("raw"), "push", layerwise=False)
    t = plan.transfer(_inst(catalog, "H100-SXM"), _inst(catalog, "A100-80G"), 1024, 0.0)
    assert t.wire_bytes == 1024 * 131072
    assert t.link_s == pytest.approx(1024 * 131072 / 50e9 + 5e-6)
    assert t.encode_s == t.decode_s == 0.0


def test_fp8_prefill_feeding_bf16_decode_pays_a_conversion(catalog):
    plan = LinkPlan(catalog.link("infiniband"), catalog.wire("raw"), "push")
    fp8_to_bf16 = plan.transfer(_inst(catalog, "H100-SXM", kv="fp8"), _inst(catalog, "H100-SXM"), 2048, 0.0)
    same = plan.transfer(_inst(catalog, "H100-SXM", kv="fp8"), _inst(catalog, "H100-SXM", kv="fp8"), 2048, 0.0)
    assert fp8_to_bf16.decode_s > 0 and same.decode_s == 0.0
    assert fp8_to_bf16.wire_bytes == same.wire_bytes == 2048 * 65536


def test_layerwise_transfer_hides_the_link_behind_prefill(catalog):
    whole = LinkPlan(catalog.link("infiniband"), catalog.wire("raw"), "push", layerwise=False)
    layered = LinkPlan(catalog.link("infiniband"), catalog.wire("raw"), "push", layerwise=True)
    p, d = _inst(catalog, "H100-SXM"), _inst(catalog, "H100-SXM")
    t_whole, t_layer = whole.transfer(p, d, 4096, 0.0), layered.transfer(p, d, 4096, 0.0)
    assert t_layer.exposed_s(prefill_s=0.5) == pytest.approx(t_layer.link_s / 32)
    assert t_whole.exposed_s(prefill_s=0.5) == pytest.approx(t_whole.link_s)


def test_compression_pays_on_a_slow_link(catalog):
    p, d = _inst(catalog, "H100-SXM"), _inst(catalog, "H100-SXM")
    raw = LinkPlan(catalog.link("pcie"), catalog.wire("raw"), "push", layerwise=False).transfer(p, d, 8192, 0.0)
    packed = LinkPlan(catalog.link("pcie"), catalog.wire("compressed"), "push",
                      layerwise=False).transfer(p, d, 8192, 0.0)
    assert packed.wire_bytes == pytest.approx(0.3 * raw.wire_bytes)
    assert packed.total_s < raw.total_s


def test_decode_pulling_skips_the_shared_prefix(catalog):
    p, d = _inst(catalog, "H100-SXM"), _inst(catalog, "H100-SXM")
    pull = LinkPlan(catalog.link("infiniband"), catalog.wire("raw"), "pull").transfer(p, d, 1000, 0.5)
    push = LinkPlan(catalog.link("infiniband"), catalog.wire("raw"), "push").transfer(p, d, 1000, 0.5)
    assert pull.wire_bytes == push.wire_bytes / 2


def test_calibration_adds_measured_links_and_wire_formats_the_plan_can_name(catalog, tmp_path):
    measured = {"calibration": {"links": {"jido-shm": {"gb_s": 2.5, "latency_us": 900.0, "same_node": False,
                                                       "source": "measured"}},
                                "wire": {"jido-int8": {"ratio": 0.26, "codec_gb_s": None, "source": "measured"}}}}
    calibrated = catalog.with_calibration(measured["calibration"])
    plan = LinkPlan(calibrated.link("jido-shm"), calibrated.wire("jido-int8"), "pull", layerwise=False)
    t = plan.transfer(_inst(calibrated, "H100-SXM"), _inst(calibrated, "H100-SXM"), 1024, 0.0)
    assert t.wire_bytes == pytest.approx(1024 * 131072 * 0.26)
    assert t.link_s == pytest.approx(t.wire_bytes / 2.5e9 + 2 * 900e-6)
    assert "pcie" in calibrated.links and "jido-shm" not in catalog.links
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(measured))
    from jido.planner.cli import plan_main
    assert plan_main(["--calibrate", str(path), "--links", "jido-shm", "--wires", "jido-int8", "--json",
                      "--model", "gemma-3-270m", "--accelerators", "cpu-2core"]) in (0, 1)
    with pytest.raises(ValueError, match="unknown section"):
        catalog.with_calibration({"link": {}})
