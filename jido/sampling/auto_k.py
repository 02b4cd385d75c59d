"""AutoK: how many tokens to propose per request this step, from measured acceptance and measured step costs."""
from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass

# Counts decay by this factor per step: the fit follows a workload that changes, over ~100 steps.
DECAY = 0.99
# Before any evidence the first proposal holds half the time, and each deeper one, given the one before it held,
# as often as the measured depths before it did (acceptance falls geometrically with depth). The prior weighs
# as much as PRIOR_WEIGHT request-steps at each depth, soon outweighed by what is measured. A flat prior of a
# half at every depth promised E(8) = 5 tokens before anything was measured, and the first steps at 32 streams
# then verified 9 rows per request.
FIRST_PRIOR, PRIOR_WEIGHT = 0.5, 2.0
# Every EXPLORE_EVERY-th step proposes one more or one fewer token than the fit prefers, so the costs of the
# neighbouring step sizes stay measured rather than extrapolated; but once measured, only a neighbour the fit
# puts within EXPLORE_MARGIN of the best. At 32 streams K = 1 costs far more than a plain step, so trying it
# every 16th step alone cost a visible share of the throughput.
EXPLORE_EVERY, EXPLORE_MARGIN = 16, 0.8


class AcceptanceModel:
    """Per-position acceptance: ``a_j``, the expected accepted proposals at depth ``j`` per request asked for
    at least ``j + 1``, from decayed counts. A proposer that has nothing to propose (an n-gram without a
    match) still counts as asked, so ``a_j`` is what asking buys, not what a proposal holds."""

    def __init__(self, max_k: int) -> None:
        self.accepted = [0.0] * max_k
        self.asked = [0.0] * max_k

    def observe(self, verified: list[tuple[int, int]]) -> None:
        """One step's (proposals asked for, proposals accepted) per request."""
        for j in range(len(self.asked)):
            self.accepted[j] *= DECAY
            self.asked[j] *= DECAY
        for num_asked, num_accepted in verified:
            for j in range(min(num_asked, len(self.asked))):
                self.asked[j] += 1
                self.accepted[j] += j < num_accepted

    def rates(self) -> list[float]:
        rates: list[float] = []
        for accepted, asked in zip(self.accepted, self.asked):
            rates.append((accepted + PRIOR_WEIGHT * self._prior(rates)) / (asked + PRIOR_WEIGHT))
        return rates

    @staticmethod
    def _prior(shallower: list[float]) -> float:
        """The next depth's prior from the rates of the depths before it: the last one times the last
        measured fall from one depth to the next (the first rate itself for depth 1), never a rise."""
        if not shallower:
            return FIRST_PRIOR
        fall = shallower[-1] / shallower[-2] if len(shallower) > 1 and shallower[-2] > 0 else shallower[0]
        return shallower[-1] * min(1.0, fall)

    def expected_tokens(self, k: int) -> float:
        """Tokens a request gains from a step that asks for ``k`` proposals: 1 + sum of ``a_j`` for ``j < k``."""
        return 1.0 + sum(self.rates()[:k])


class CostCurve:
    """Seconds of a pass by its size (rows, or requests), measured: a decayed mean per size seen, linear
    between sizes, and beyond them along the slope of the nearest two. With one size measured, in proportion
    to the size: every row costs its share until a second size shows what rows cost.

    Below the smallest size measured the line is kept between that size's cost (a pass never costs more for
    fewer rows) and the same cost scaled down with the size (nor less than in proportion).
    """

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.seconds: list[float] = []
        self.counts: list[int] = []

    def observe(self, size: int, seconds: float) -> None:
        i = bisect.bisect_left(self.sizes, size)
        if i < len(self.sizes) and self.sizes[i] == size:
            # The plain mean of the first ten passes of a size (a slow first pass, well above the next ones, fades
            # as fast as it can), then a mean over about the last ten.
            self.counts[i] += 1
            self.seconds[i] += (seconds - self.seconds[i]) / min(self.counts[i], 10)
        else:
            self.sizes.insert(i, size)
            self.seconds.insert(i, seconds)
            self.counts.insert(i, 1)

    def measured(self, size: int) -> bool:
        i = bisect.bisect_left(self.sizes, size)
        return i < len(self.sizes) and self.sizes[i] == size

    def predict(self, size: int) -> float | None:
        if not self.sizes:
            return None
        i = bisect.bisect_left(self.sizes, size)
        if i < len(self.sizes) and self.sizes[i] == size:
            return self.seconds[i]
        if len(self.sizes) == 1:
            return self.seconds[0] * size / self.sizes[0]
        lo = min(max(i - 1, 0), len(self.sizes) - 2)
        slope = (self.seconds[lo + 1] - self.seconds[lo]) / (self.sizes[lo + 1] - self.sizes[lo])
        value = self.seconds[lo] + slope * (size - self.sizes[lo])
        if i == 0:
            return min(max(value, self.seconds[0] * size / self.sizes[0]), self.seconds[0])
        return max(value, self.seconds[-1]) if i == len(self.sizes) else value


@dataclass(frozen=True)
class KChoice:
    """The step size chosen for a batch, and the throughput the fit expects of each candidate."""

    k: int
    tokens_per_s: tuple[float, ...]  # by k = 0, 1, ..., max_k (0 where a cost is not yet known)


class AutoK:
    """Picks K per step to maximise expected output tokens per second, ``B * E(K) / (verify(B * (K + 1)) + draft(B, K))``.

    ``E(K)`` comes from :class:`AcceptanceModel`; the target's pass is a :class:`CostCurve` over the rows of its
    decode and verify passes (passes with prefill chunks are left out: their tokens cost far less than a verify
    row), the proposer's a curve over the batch per proposed token. While verifying K + 1 rows costs about
    what one costs (decode reads the weights once per step), a large K pays; as the batch grows the pass becomes compute-bound, each extra row costs its share, and
    the best K falls, to 0 (no speculation) once no expected acceptance covers the rows it adds.
    """

    def __init__(self, max_k: int) -> None:
        self.max_k = max_k
        self.acceptance = AcceptanceModel(max_k)
        self.verify_cost = CostCurve()  # seconds of the target's pass by tokens computed
        self.draft_cost = CostCurve()  # seconds per proposed token by requests proposed for
        self.chosen: Counter[tuple[int, int]] = Counter()  # (requests, K) -> steps that chose it
        self._num_steps = 0

    def observe_step(self, num_rows: int | None, model_s: float, verified: list[tuple[int, int]]) -> None:
        """A decode/verify pass over ``num_rows`` sampled rows took ``model_s`` (``None``: a pass with prefill
        tokens, which prices no K); its requests' (asked, accepted) proposals."""
        if num_rows is not None:
            self.verify_cost.observe(num_rows, model_s)
        self.acceptance.observe(verified)

    def observe_proposal(self, num_requests: int, k: int, propose_s: float) -> None:
        if k > 0 and num_requests > 0:
            self.draft_cost.observe(num_requests, propose_s / k)

    def choose(self, num_requests: int) -> KChoice:
        """The K to propose for ``num_requests`` decoding requests (0: do not speculate)."""
        self._num_steps += 1
        rates = [self._tokens_per_s(num_requests, k) for k in range(self.max_k + 1)]
        best = max(range(self.max_k + 1), key=lambda k: rates[k])
        if self._num_steps % EXPLORE_EVERY == 0:
            other = min(self.max_k, best + 1) if (self._num_steps // EXPLORE_EVERY) % 2 else max(0, best - 1)
            unmeasured = not self.verify_cost.measured(num_requests * (other + 1))
            if unmeasured or rates[other] >= EXPLORE_MARGIN * rates[best]:
                best = other
        self.chosen[(num_requests, best)] += 1
        return KChoice(best, tuple(rates))

    def _tokens_per_s(self, num_requests: int, k: int) -> float:
        verify = self.verify_cost.predict(num_requests * (k + 1))
        if verify is None:  # no decode pass measured yet: plain decode first, then its cost prices the others
            return 0.0 if k else 1.0
        # A proposer not yet timed is taken as free: its first step measures it.
        draft = (self.draft_cost.predict(num_requests) or 0.0) if k else 0.0
        seconds = verify + draft * k
        return num_requests * self.acceptance.expected_tokens(k) / seconds if seconds > 0 else 0.0
