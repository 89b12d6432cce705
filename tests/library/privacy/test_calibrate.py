"""The σ search: the smallest noise that keeps ε at the target, in a handful of evaluations."""

from __future__ import annotations

import math

import pytest

from privpipe.privacy.calibrate import calibrate_noise_multiplier


def counted(epsilon_of):
    calls = []

    def wrapped(sigma: float) -> float:
        calls.append(sigma)
        return epsilon_of(sigma)
    return wrapped, calls


def kinked(sigma: float) -> float:
    """Like DP-SGD: ε ∝ 1/σ² at little noise, ∝ 1/σ at more, unbounded below σ = 0.05."""
    if sigma < 0.05:
        return math.inf
    return 4 / sigma**2 if sigma < 1 else 4 / sigma


@pytest.mark.parametrize("target", [0.01, 0.5, 3.0, 40.0, 1000.0])
@pytest.mark.parametrize("start", [None, 1e-2, 1.0, 50.0, 1e4])
def test_the_search_returns_the_least_noise_within_the_target_from_any_start(target, start):
    epsilon_of, calls = counted(kinked)
    sigma = calibrate_noise_multiplier(epsilon_of, target_epsilon=target, start=start)
    assert kinked(sigma) <= target
    # the least such σ: either σ itself is pinned to 0.1 %, or ε there is within 0.1 % of the target
    assert kinked(sigma * math.exp(-2e-3)) > target or kinked(sigma) >= target * math.exp(-1e-3)
    assert len(calls) <= 20


def test_a_start_near_the_answer_needs_few_evaluations():
    exact = 4 / 3.0  # kinked(σ) = 3 at σ = 4/3
    far, far_calls = counted(kinked)
    near, near_calls = counted(kinked)
    assert calibrate_noise_multiplier(far, target_epsilon=3.0) == pytest.approx(exact, rel=2e-3)
    assert calibrate_noise_multiplier(near, target_epsilon=3.0, start=1.4, start_epsilon=kinked(1.4)) == \
        pytest.approx(exact, rel=2e-3)
    assert len(near_calls) <= 3 < len(far_calls)


@pytest.mark.parametrize("start", [None, 1.0, 1e4])
def test_an_unreachable_target_is_refused_and_one_that_fits_at_the_floor_returns_it(start):
    with pytest.raises(ValueError, match="cannot be reached at any noise multiplier <= 10000"):
        calibrate_noise_multiplier(kinked, target_epsilon=1e-6, start=start)
    assert calibrate_noise_multiplier(lambda s: 0.0, target_epsilon=1.0, start=start) == 1e-2
    with pytest.raises(ValueError, match="target_epsilon must be > 0"):
        calibrate_noise_multiplier(kinked, target_epsilon=0.0, start=start)


def test_a_start_above_the_range_with_its_epsilon_is_not_taken_for_the_clamped_end():
    """The ε given for a start beyond ``high`` belongs to that start, not to ``high``: the search
    evaluates ``high`` itself (before, a start of 1e6 made it return σ = 10 at ε = 0.1 for a target of
    0.05 that no σ <= 10 reaches)."""
    epsilon_of = lambda sigma: 1 / sigma  # noqa: E731
    found = calibrate_noise_multiplier(epsilon_of, target_epsilon=0.05, high=100, start=1e6, start_epsilon=1e-6)
    assert found == pytest.approx(20, rel=2e-3) and epsilon_of(found) <= 0.05
    with pytest.raises(ValueError, match="cannot be reached at any noise multiplier <= 10$"):
        calibrate_noise_multiplier(epsilon_of, target_epsilon=0.05, high=10, start=1e6, start_epsilon=1e-6)
