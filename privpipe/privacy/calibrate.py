"""Find the smallest noise multiplier that keeps ε at or under a target.

ε decreases monotonically in the noise multiplier for every event we build, so a
bisection on log σ finds it. The result errs on the side of more noise: the
returned σ always satisfies ε(σ) ≤ target.
"""

from __future__ import annotations

import math
from typing import Callable

__all__ = ["calibrate_noise_multiplier"]

LOW, HIGH = 1e-2, 1e4


def calibrate_noise_multiplier(
    epsilon_of: Callable[[float], float],
    *,
    target_epsilon: float,
    low: float = LOW,
    high: float = HIGH,
    rel_tol: float = 1e-3,
) -> float:
    """Smallest σ (to ``rel_tol``) with ``epsilon_of(σ) <= target_epsilon``.

    The search runs over [low, high], on log ε against log σ (nearly straight for these
    mechanisms), by the Illinois variant of regula falsi: each step stays at least rel_tol / 2
    inside the bracket, so it ends, usually after a handful of evaluations where bisection
    needs a dozen (each a PLD). The bracket always keeps ε(lo) > target ≥ ε(hi), and σ = hi is
    returned. Raises ValueError if even σ = ``high`` overshoots (the target is unreachable,
    e.g. because earlier stages spent it).
    """
    if not target_epsilon > 0:
        raise ValueError(f"target_epsilon must be > 0, got {target_epsilon!r}")
    at_high = epsilon_of(high)
    if at_high > target_epsilon:
        raise ValueError(f"target ε = {target_epsilon:g} cannot be reached at any noise multiplier <= {high:g}")
    at_low = epsilon_of(low)
    if at_low <= target_epsilon:
        return low
    lo, hi = math.log(low), math.log(high)
    f_lo, f_hi = _gap(at_low, target_epsilon), _gap(at_high, target_epsilon)
    replaced = 0  # which end the last step replaced: -1 lo, +1 hi
    while hi - lo > rel_tol:
        mid = hi - f_hi * (hi - lo) / (f_hi - f_lo) if math.isfinite(f_lo) else (lo + hi) / 2
        mid = min(max(mid, lo + rel_tol / 2), hi - rel_tol / 2)
        f_mid = _gap(epsilon_of(math.exp(mid)), target_epsilon)
        if f_mid > 0:
            lo, f_lo = mid, f_mid
            if replaced == -1:  # lo moved twice running: weigh hi less (Illinois), or it creeps
                f_hi /= 2
            replaced = -1
        else:
            hi, f_hi = mid, f_mid
            if replaced == 1:
                f_lo /= 2
            replaced = 1
    return math.exp(hi)


def _gap(epsilon: float, target: float) -> float:
    """log(ε / target): > 0 above the target; +inf for an unbounded ε, a large negative for ε = 0."""
    if math.isinf(epsilon):
        return math.inf
    return math.log(max(epsilon, 1e-300) / target)
