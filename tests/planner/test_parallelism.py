from __future__ import annotations

import pytest

from jido.planner.parallelism import (ep_all_to_alls, pipeline_bubble, pp_transfers, ring_all_reduce_s,
                                      smallest_tp, tp_all_reduces_per_token)


def test_tp8_over_80_layers_is_160_all_reduces_per_token():
    assert tp_all_reduces_per_token(80, 8) == 160


def test_tp1_needs_no_all_reduce():
    assert tp_all_reduces_per_token(80, 1) == 0


def test_pp4_crosses_3_stage_boundaries():
    assert pp_transfers(4) == 3


@pytest.mark.parametrize("p, m", [(4, 1), (4, 8), (8, 32), (1, 4)])
def test_pipeline_bubble_is_p_minus_1_over_m_plus_p_minus_1(p, m):
    assert pipeline_bubble(p, m) == pytest.approx((p - 1) / (m + p - 1))


def test_pipeline_bubble_of_4_stages_and_8_micro_batches_is_3_over_11():
    assert pipeline_bubble(4, 8) == pytest.approx(3 / 11)


def test_expert_parallelism_dispatches_and_combines_per_moe_layer():
    assert ep_all_to_alls(32, 8) == 64


def test_ring_all_reduce_moves_2_t_minus_1_over_t_of_the_buffer():
    seconds = ring_all_reduce_s(1e9, 8, 100.0, latency_us=0.0)
    assert seconds == pytest.approx(2 * 7 / 8 * 1e9 / 100e9)


def test_smallest_tp_fitting_70b_bf16_on_80gb_is_2():
    assert smallest_tp(141e9, 72e9, 8) == 2
    assert smallest_tp(141e9, 16e9, 8) is None
