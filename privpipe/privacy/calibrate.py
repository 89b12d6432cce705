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

    The search runs over [low, high]. Raises ValueError if even σ = ``high``
    overshoots (the target is unreachable, e.g. because earlier stages spent it).
    """
    if not target_epsilon > 0:
        raise ValueError(f"target_epsilon must be > 0, got {target_epsilon!r}")
    if epsilon_of(high) > target_epsilon:
        raise ValueError(f"target ε = {target_epsilon:g} cannot be reached at any noise multiplier <= {high:g}")
    if epsilon_of(low) <= target_epsilon:
        return low
    lo, hi = math.log(low), math.log(high)  # ε(e^lo) > target >= ε(e^hi)
    while hi - lo > rel_tol:
        mid = (lo + hi) / 2
        if epsilon_of(math.exp(mid)) > target_epsilon:
            lo = mid
        else:
            hi = mid
    return math.exp(hi)
