from __future__ import annotations

import pytest

from jido.planner.model_shapes import CATALOG
from jido.planner.roofline import Instance, Role, StepBatch, build_instance


def _instance(catalog, accelerator, model="llama-3.1-8b", precision="bf16", residency="hbm"):
    return build_instance(CATALOG[model], Role(accelerator, precision, "bf16"), catalog.accelerator(accelerator),
                          catalog.residency(residency), catalog.efficiency, 4096)


def test_a100_prefill_leaves_about_97_percent_of_hbm_bandwidth_unused(catalog):
    cost = _instance(catalog, "A100-80G").step(StepBatch.prefill(4096))
    assert cost.bound == "compute"
    assert 1 - cost.bandwidth_utilization == pytest.approx(0.97, abs=0.015)
    assert cost.compute_utilization == pytest.approx(0.6, abs=0.01)


@pytest.mark.parametrize("batch", [1, 8])
def test_small_batch_decode_is_bandwidth_bound(catalog, batch):
    cost = _instance(catalog, "A100-80G").step(StepBatch.decode(batch, 1024))
    assert cost.bound == "memory"
    assert cost.compute_utilization < 0.05
    assert cost.bandwidth_utilization > 0.6


def test_decode_step_reads_the_weights_once_plus_each_sequences_kv(catalog):
    inst = _instance(catalog, "H100-SXM")
    one, two = (inst.step(StepBatch.decode(n, 1000)) for n in (1, 2))
    per_seq_kv = CATALOG["llama-3.1-8b"].kv_bytes(1000)
    assert two.device_bytes - one.device_bytes == pytest.approx(per_seq_kv + 131072)


def test_70b_needs_tp2_on_80gb_and_pays_160_all_reduces(catalog):
    inst = _instance(catalog, "H100-SXM", model="llama-3.1-70b")
    assert inst.tp == 2
    assert inst.step(StepBatch.decode(8, 1000)).comm_s > 0


def test_fp8_halves_weight_bytes(catalog):
    bf16 = _instance(catalog, "H100-SXM")
    fp8 = _instance(catalog, "H100-SXM", precision="fp8")
    assert fp8.weight_bytes == bf16.weight_bytes / 2


def test_kv_off_device_adds_access_latency(catalog):
    hbm = _instance(catalog, "H100-SXM").step(StepBatch.decode(4, 2000))
    nvme = _instance(catalog, "H100-SXM", residency="nvme").step(StepBatch.decode(4, 2000))
    assert nvme.time_s > hbm.time_s + 32 * 100e-6


def test_moe_decode_reads_only_touched_experts(catalog):
    inst = build_instance(CATALOG["mixtral-8x7b"], Role("H100-SXM"), catalog.accelerator("H100-SXM"),
                          catalog.residency("hbm"), catalog.efficiency, 1024)
    assert isinstance(inst, Instance)
    one = inst.step(StepBatch.decode(1, 100)).device_bytes
    many = inst.step(StepBatch.decode(64, 100)).device_bytes
    assert one < 0.4 * inst.weight_bytes
    assert many > 0.95 * inst.weight_bytes
