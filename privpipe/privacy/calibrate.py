"""Find the smallest noise multiplier that keeps ε at or under a target.

ε decreases monotonically in the noise multiplier for every event we build, so a root search
on log ε against log σ finds it. The result errs on the side of more noise: the returned σ
always satisfies ε(σ) ≤ target.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["calibrate_noise_multiplier"]

LOW, HIGH = 1e-2, 1e4
#: log ε against log σ: about -1 for DP-SGD at moderate ε, steeper at large ε. A search from a
#: start point steps by this slope, a little past where it predicts the root, to bracket it at once.
SLOPE, OVERSHOOT = -1.0, 1.1


def calibrate_noise_multiplier(
    epsilon_of: Callable[[float], float],
    *,
    target_epsilon: float,
    low: float = LOW,
    high: float = HIGH,
    rel_tol: float = 1e-3,
    start: float | None = None,
    start_epsilon: float | None = None,
) -> float:
    """Smallest σ in [low, high] with ``epsilon_of(σ) <= target_epsilon``, to ``rel_tol`` in log σ or in
    log ε (whichever comes first: either way ε(σ) is within about rel_tol of the target, or σ of the least).

    Without ``start`` the bracket is [low, high]. With it, the bracket grows from ``start``
    (whose ε may be given as ``start_epsilon``, saving an evaluation): one step along SLOPE to a
    little past the predicted root, doubling until ε crosses the target. Either way the
    Illinois variant of regula falsi then narrows it (each step at least rel_tol / 2 inside),
    keeping ε(lo) > target ≥ ε(hi), and σ = hi is returned: a handful of evaluations, each
    possibly a PLD. Raises ValueError if even σ = ``high`` overshoots (the target is
    unreachable, e.g. because earlier stages spent it); returns ``low`` if that already fits.
    """
    if not target_epsilon > 0:
        raise ValueError(f"target_epsilon must be > 0, got {target_epsilon!r}")
    floor, ceiling = math.log(low), math.log(high)

    def gap_at(x: float) -> float:
        return _gap(epsilon_of(math.exp(x)), target_epsilon)

    if start is None:
        f_hi = gap_at(ceiling)
        if f_hi > 0:
            raise _unreachable(target_epsilon, high)
        lo, f_lo = floor, gap_at(floor)
        if f_lo <= 0:
            return low
        hi = ceiling
    else:
        x = min(max(math.log(start), floor), ceiling)
        given = start_epsilon is not None and x == math.log(start)  # (ε at a start clamped into range: unknown)
        f = _gap(start_epsilon, target_epsilon) if given and start_epsilon is not None else gap_at(x)
        lo, f_lo, hi, f_hi = _bracket(gap_at, x, f, floor, ceiling)
        if f_lo <= 0:
            return low
        if f_hi > 0:
            raise _unreachable(target_epsilon, high)
    replaced, at_hi = 0, f_hi  # which end the last step replaced (-1 lo, +1 hi); hi's gap, unweighted
    while hi - lo > rel_tol and at_hi < -rel_tol:  # done when σ is pinned, or ε(hi) is within rel_tol of it
        mid = hi - f_hi * (hi - lo) / (f_hi - f_lo) if math.isfinite(f_lo) else (lo + hi) / 2
        mid = min(max(mid, lo + rel_tol / 2), hi - rel_tol / 2)
        f_mid = gap_at(mid)
        if f_mid > 0:
            lo, f_lo = mid, f_mid
            if replaced == -1:  # lo moved twice running: weigh hi less (Illinois), or it creeps
                f_hi /= 2
            replaced = -1
        else:
            hi, f_hi, at_hi = mid, f_mid, f_mid
            if replaced == 1:
                f_lo /= 2
            replaced = 1
    return math.exp(hi)


def _bracket(gap_at: Callable[[float], float], x: float, f: float, floor: float,
             ceiling: float) -> tuple[float, float, float, float]:
    """(lo, gap(lo), hi, gap(hi)) around the root from log σ = x, or with lo = floor / hi = ceiling
    when the root lies beyond that end (the caller then returns low or refuses)."""
    step = OVERSHOOT * f / -SLOPE if math.isfinite(f) and f != 0 else 1.0
    step = math.copysign(max(abs(step), 1e-2), 1.0 if f > 0 else -1.0)  # ε above the target: more noise
    while True:
        y = min(max(x + step, floor), ceiling)
        g = gap_at(y)
        if (g > 0) != (f > 0) or y in (floor, ceiling):
            break
        x, f, step = y, g, 2 * step
    if f > 0 and g > 0:  # ran into the ceiling
        return x, f, y, g
    if f <= 0 and g <= 0:  # ran into the floor
        return y, g, x, f
    return (x, f, y, g) if f > 0 else (y, g, x, f)


def _unreachable(target: float, high: float) -> ValueError:
    return ValueError(f"target ε = {target:g} cannot be reached at any noise multiplier <= {high:g}")


def _gap(epsilon: float, target: float) -> float:
    """log(ε / target): > 0 above the target; +inf for an unbounded ε, a large negative for ε = 0."""
    if math.isinf(epsilon):
        return math.inf
    return math.log(max(epsilon, 1e-300) / target)
