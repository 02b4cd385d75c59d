"""AutoK fits acceptance and costs from what steps measure, and picks the K that maximises tokens per second."""
from __future__ import annotations

import random

import pytest

from jido.sampling.auto_k import EXPLORE_EVERY, AcceptanceModel, AutoK, CostCurve

MAX_K = 8


def memory_bound_then_compute_bound(num_tokens: int) -> float:
    """A CPU-like pass: reading the weights (30 ms) covers up to 16 rows; each row past them costs 2 ms."""
    return 0.030 + 0.002 * max(0, num_tokens - 16)


def run(batch: int, steps: int, alpha: float = 0.8, seed: int = 0) -> tuple[AutoK, list[int]]:
    """Drive AutoK against the machine above with proposals that each hold with probability alpha."""
    rng = random.Random(seed)
    auto = AutoK(MAX_K)
    chosen, k = [], auto.choose(batch).k
    for _ in range(steps):
        outcomes = []
        for _ in range(batch):
            accepted = 0
            while accepted < k and rng.random() < alpha:
                accepted += 1
            outcomes.append((k, accepted))
        auto.observe_step(batch * (k + 1), memory_bound_then_compute_bound(batch * (k + 1)), outcomes)
        auto.observe_proposal(batch, k, 1e-5 * batch * k)  # n-gram lookups: next to nothing
        k = auto.choose(batch).k
        chosen.append(k)
    return auto, chosen


@pytest.mark.parametrize("batch, best", [(1, MAX_K), (8, 1), (32, 0)])
def test_k_falls_as_the_batch_grows_and_speculation_stops_once_decode_is_compute_bound(batch, best):
    # Worked out by hand for alpha 0.8 (E(K) = 1 + 0.8 + ... + 0.8^K): batch 1 costs 30 ms up to K = 15, so the
    # most tokens win; batch 8 at K = 1 fills exactly the 16 free rows (8 * 1.8 / 30 ms beats 8 * 2.44 / 46 ms);
    # batch 32 already pays for its rows (32 / 62 ms beats 32 * 1.8 / 126 ms).
    _, chosen = run(batch, steps=200)
    settled = [k for i, k in enumerate(chosen[100:], start=101) if i % EXPLORE_EVERY]
    assert max(set(settled), key=settled.count) == best
    assert settled.count(best) / len(settled) > 0.9


def test_acceptance_rates_are_the_expected_accepted_proposals_per_position_asked():
    model = AcceptanceModel(3)
    for _ in range(2000):
        model.observe([(3, 3), (3, 1), (2, 0), (0, 0)])  # the last asked for nothing: it counts nowhere
    rates = model.rates()
    assert rates == pytest.approx([2 / 3, 1 / 3, 1 / 2], abs=0.01)
    assert model.expected_tokens(2) == pytest.approx(1 + 2 / 3 + 1 / 3, abs=0.02)


def test_cost_curve_interpolates_between_measured_sizes_and_extends_their_slope():
    curve = CostCurve()
    assert curve.predict(4) is None
    curve.observe(4, 0.010)
    assert curve.predict(64) == pytest.approx(0.160)  # one point: every row its share
    curve.observe(20, 0.018)
    assert curve.predict(12) == pytest.approx(0.014) and curve.predict(36) == pytest.approx(0.026)
    # Below 4 the line would reach 0.0085 at 1; a quarter of the rows cost no less than a quarter: 0.0025.
    assert curve.predict(1) == pytest.approx(0.0085)
    curve.observe(2, 0.001)
    assert curve.predict(1) == pytest.approx(0.0005)  # the proportional floor, not the line's negative value


def test_unmeasured_depths_expect_the_fall_measured_at_shallower_ones():
    model = AcceptanceModel(4)
    assert model.rates() == pytest.approx([0.5, 0.25, 0.125, 0.0625])  # nothing measured: halves
    for _ in range(500):
        model.observe([(2, 2), (2, 2), (2, 2), (2, 1), (2, 0)])  # depth 0 holds 4/5, depth 1 3/5; never asked deeper
    rates = model.rates()
    assert rates[:2] == pytest.approx([0.8, 0.6], abs=0.01)
    fall = rates[1] / rates[0]
    assert rates[2] == pytest.approx(rates[1] * fall) and rates[3] == pytest.approx(rates[2] * fall)


def test_the_first_step_is_plain_decode_and_one_measured_size_prices_more_rows_in_proportion():
    # Before, nothing measured meant K = MAX_K (9 rows per request: a 2 s step at 32 streams), and prefill chunks
    # priced the rows beyond: they cost a third of a verify row each here, so auto K verified far too many.
    auto = AutoK(MAX_K)
    assert auto.choose(32).k == 0
    auto.observe_step(None, 0.5, [(0, 0)] * 32)  # a pass with prefill chunks: its time prices nothing
    assert auto.verify_cost.predict(32) is None
    auto.observe_step(32, memory_bound_then_compute_bound(32), [(0, 0)] * 32)
    assert auto.choose(32).k == 0  # 2x the rows for at most 1.5x the tokens
    assert auto.verify_cost.predict(64) == pytest.approx(2 * memory_bound_then_compute_bound(32))


def test_exploration_finds_that_extra_rows_are_cheap_at_batch_1():
    _, chosen = run(1, steps=60)
    assert chosen[0] == 0 and max(set(chosen[-20:]), key=chosen[-20:].count) == MAX_K


def test_a_measured_neighbour_far_below_the_best_is_not_tried_again_but_an_unmeasured_one_is():
    auto = AutoK(MAX_K)
    auto.observe_step(32, 0.300, [(0, 0)] * 32)
    auto.observe_step(64, 0.650, [(1, 1)] * 16 + [(1, 0)] * 16)  # K = 1: twice the cost, half of its proposals held
    chosen = [auto.choose(32).k for _ in range(4 * EXPLORE_EVERY)]
    assert set(chosen) == {0}
    fresh = AutoK(MAX_K)
    fresh.observe_step(32, 0.300, [(0, 0)] * 32)
    assert [fresh.choose(32).k for _ in range(2 * EXPLORE_EVERY)].count(1) == 1  # 64 rows never measured: tried


def test_a_slow_first_pass_of_a_size_fades_within_ten_passes():
    curve = CostCurve()
    curve.observe(2, 0.097)  # the first 2-row pass, 2.7x the ones after it
    for _ in range(9):
        curve.observe(2, 0.036)
    assert curve.predict(2) == pytest.approx((0.097 + 9 * 0.036) / 10)
    for _ in range(30):
        curve.observe(2, 0.036)
    assert curve.predict(2) == pytest.approx(0.036, abs=0.0003)
