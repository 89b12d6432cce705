"""Composing privacy events into an (ε, δ): the RDP curve and its conversion, PLDs sized in advance,
and the PLD-plus-RDP split for custom curves. The accountants (:mod:`privpipe.privacy.accountants`) are
made of these; every function is cached on the events (frozen values), so a total asked several times
is composed once.

All from the maintained ``dp_accounting`` library; add-or-remove-one adjacency of one record.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant
from numpy.typing import NDArray
from scipy import optimize

from privpipe.config.privacy import RDP_ORDERS
from privpipe.privacy.events import Event, RdpCurveEvent
from privpipe.privacy.quiet import quiet_rdp_warnings

__all__ = ["Spend", "RDP_ORDERS", "SEARCH_ORDERS", "PLD_MAX_STEPS", "SPLIT_DELTA_SHARES", "rdp_epsilon", "event_rdp",
           "pld_at", "saddle_point", "refined_pld", "refined_pld_epsilon", "pld_epsilon_at", "orders_near",
           "split_candidates", "composed_steps", "classic_rdp_epsilon", "clear_caches"]

#: the orders the σ search brackets with before its PLD steps: a quarter of RDP_ORDERS' time; an ε within
#: about 0.1 % of theirs at moderate ε, far looser at large ε (no orders below 2), an upper bound always.
#: Only the search's start and the PLD grid's span come from it, never a reported figure.
SEARCH_ORDERS: tuple[float, ...] = tuple(a for a in RDP_ORDERS if a.is_integer() and (a <= 32 or a % 8 == 0 or a > 64))
#: PLD discretisation interval h: pessimistic rounding makes the ε of every h an upper bound. Its excess
#: over the tight value is sized before any PLD is built (:func:`_grid_for`): pessimistic
#: connect-the-dots rounding moves the mass of each grid cell to its two ends keeping both
#: distributions' masses, a spread that raises E[e^{λL}] of each discretised factor by about
#: λ(λ + 1)/2 · E[d(h − d)] relative, d = L mod h under the loss tilted by e^{λL} (h²/6 where the
#: density is smooth across cells); over the factors ε rises by the sum of that divided by λ, at the
#: tilt λ where the saddle-point approximation of δ(ε) meets δ. So h is chosen for a predicted excess of
#: PLD_TOLERANCE of the ε that approximation gives, and one PLD is built (measured within 0.2 % of the
#: tight value: tests/library/privacy/test_ledger.py, bench/out/accounting/speed.md). Where no prediction can be made,
#: h starts coarse and is refined (the former way, :func:`_refined_by_levels`).
PLD_COARSEST, PLD_FINEST = 1e-2, 1e-5
PLD_TOLERANCE = 1.5e-3
#: the refinement's tolerance where no size is predicted (:func:`_refined_by_levels`)
LEVELS_TOLERANCE = 1.5e-3
#: a PLD's grid spans the privacy losses up to about ε: h is never so fine
#: that it needs more points than this (σ = 0.01 at the fixed 1e-4 took 4.6 minutes)
PLD_MAX_POINTS = 2_000_000
#: past this many composed steps a PLD takes minutes (10⁷ DP-SGD steps: 37 s a level; 10⁹ asked
#: for terabytes), and RDP's bound, sound as ever, is reported instead, named rdp
PLD_MAX_STEPS = 2_000_000
#: shares of δ given to the custom curves when ``best`` splits PLD and RDP (fixed, data-independent)
SPLIT_DELTA_SHARES = (0.1, 0.3, 0.5, 0.7, 0.9)


@dataclass(frozen=True)
class Spend:
    epsilon: float
    delta: float
    accountant: str  # the accountant whose bound is reported: "pld" or "rdp"

    def __str__(self) -> str:
        return f"(ε = {self.epsilon:.4g}, δ = {self.delta:g}) by {self.accountant.upper()}"


def _rdp_curve(events: Sequence[Event], orders: tuple[float, ...] = RDP_ORDERS) -> NDArray[np.float64]:
    with quiet_rdp_warnings():
        return _compose_rdp(events, orders)


def _compose_rdp(events: Sequence[Event], orders: tuple[float, ...]) -> NDArray[np.float64]:
    return sum((event_rdp(event, orders) for event in events), np.zeros(len(orders)))


@functools.lru_cache(maxsize=512)
def event_rdp(event: Event, orders: tuple[float, ...]) -> NDArray[np.float64]:
    """One event's RDP curve (RDP composes by addition, so a total and a stage alone share it)."""
    curve = np.array(event.rdp_at(orders), dtype=float)  # (a copy: the event may cache its own)
    curve.flags.writeable = False  # shared by every caller of the cache: changed in place, ε would be wrong
    return curve


@functools.lru_cache(maxsize=512)
def rdp_epsilon(events: tuple[Event, ...], delta: float, orders: tuple[float, ...] = RDP_ORDERS) -> float:
    """RDP's ε at ``delta`` from ``orders`` (any subset of RDP_ORDERS gives an upper bound on the whole)."""
    # a custom curve that holds only with probability 1 - δ_e spends δ_e of the run's δ
    spent = sum(e.delta for e in events if isinstance(e, RdpCurveEvent))
    if spent >= delta:
        raise ValueError(f"custom RDP curves need δ = {spent:g} of the run's δ = {delta:g}; nothing is left to convert")
    try:
        epsilon, _ = rdp_privacy_accountant.compute_epsilon(orders, _rdp_curve(events, orders), delta - spent)
    except (ZeroDivisionError, OverflowError):  # σ so small that σ² underflows: no finite bound at any order
        return math.inf
    return float(epsilon)


@functools.lru_cache(maxsize=4)  # the σ search's last PLDs are the reported figure's; up to 32 MB each
def pld_at(events: tuple[Event, ...], interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The events' PLDs at h = ``interval``, composed (each event's own: see the module docstring)."""
    pld = privacy_loss_distribution.identity(value_discretization_interval=interval)
    for event in events:
        pld = pld.compose(event.to_pld(interval))
    return pld


@functools.lru_cache(maxsize=512)
def saddle_point(events: tuple[Event, ...], delta: float) -> tuple[float, float] | None:
    """(ε, λ) by the saddle-point approximation of δ(ε) = E[(1 − e^{ε−L})₊] from the events' cumulant
    generating function K(λ) = Σ log E[e^{λL}]: log δ ≈ K − λK′ − log(λ(λ + 1)) − ½·log(2πK″) at the tilt
    λ whose mean K′(λ) is ε. An estimate (typically within a few % of the tight ε), used only to size
    the PLD's grid; None where it cannot be had (K infinite or not finite, no root)."""
    def k(lam: float) -> tuple[float, float, float]:
        parts = [e.log_mgf(lam) for e in events]
        return sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts)

    def gap(log_lam: float) -> float:
        lam = math.exp(log_lam)
        value, slope, curvature = k(lam)
        if not (math.isfinite(value) and math.isfinite(slope) and curvature > 0):
            raise FloatingPointError
        return value - lam * slope - math.log(lam * (lam + 1)) - 0.5 * math.log(2 * math.pi * curvature) \
            - math.log(delta)

    try:
        with np.errstate(all="ignore"):
            low, high = math.log(0.5), math.log(2.0)
            while gap(low) < 0:  # gap falls as λ grows: bracket the root
                low, high = low - math.log(4), low
                if low < math.log(1e-6):
                    return None
            while gap(high) > 0:
                low, high = high, high + math.log(4)
                if high > math.log(1e5):
                    return None
            lam = math.exp(optimize.brentq(gap, low, high, xtol=1e-3))
            epsilon = k(lam)[1]
    except (FloatingPointError, OverflowError, ZeroDivisionError, ValueError):
        return None
    return (epsilon, lam) if math.isfinite(epsilon) and epsilon > 0 else None


def _grid_for(events: tuple[Event, ...], epsilon: float, lam: float) -> float:
    """The h whose predicted excess (module constants' comment) is at most PLD_TOLERANCE of ``epsilon``:
    (λ + 1)/2 · Σ E[d(h − d)], d = L mod h under the tilted loss of each factor (h²/6 for a smooth one).
    The spread wobbles with h where mass sits near one loss (a sampled Gaussian's bulk near log(1 − q)):
    from the smooth guess, a few steps of h ← h·√(target/predicted), then the last step down until it fits."""
    target = PLD_TOLERANCE * epsilon

    def excess(h: float) -> float:
        return (lam + 1) / 2 * sum(e.rounding_spread(lam, h) for e in events)

    interval = math.sqrt(12 * target / ((lam + 1) * sum(e.pld_factors for e in events)))
    for _ in range(3):
        interval *= min(math.sqrt(target / excess(interval)), 1.5)
    while excess(interval) > target:
        interval *= 0.95
    return interval


def refined_pld(events: Sequence[Event],
                delta: float) -> tuple[privacy_loss_distribution.PrivacyLossDistribution, float, float]:
    """(the PLD, its ε at ``delta``, its h): h sized so that the ε is within PLD_TOLERANCE of the tight
    value (see PLD_TOLERANCE); the ε is the smallest of the grids tried (each is an upper bound). The
    PLD is cached and shared: read it, never compose onto it."""
    events = tuple(events)
    best, interval = refined_pld_epsilon(events, delta)
    return pld_at(events, interval), best, interval  # (the last PLD built: cached, unless evicted since)


@functools.lru_cache(maxsize=512)
def refined_pld_epsilon(events: tuple[Event, ...], delta: float) -> tuple[float, float]:
    """(ε, h) of :func:`refined_pld`; the PLDs themselves stay in pld_at's small cache (up to 32 MB each).

    One PLD at the h sized from the saddle-point ε; a second, finer, only where the PLD's own ε shows
    that estimate was more than 20 % high (its h then too coarse) or the grid could not hold the losses
    (ε = inf). Without an estimate, the former refinement from a coarse grid."""
    saddle = saddle_point(events, delta)
    if saddle is None:
        span = rdp_epsilon(events, delta)
        if math.isinf(span):
            return math.inf, PLD_COARSEST
        return _refined_by_levels(events, delta, max(span, 1.0))
    predicted, lam = saddle
    finest = max(PLD_FINEST, max(predicted, 1.0) / PLD_MAX_POINTS)
    # never coarser than PLD_COARSEST, unless even that needs more than PLD_MAX_POINTS (σ = 1e-3: ε ≈ 5·10⁵, at
    # h = 0.01 a grid of 10⁸ points and 18 GB)
    interval = min(max(_grid_for(events, predicted, lam), finest), max(PLD_COARSEST, finest))
    epsilon = float(pld_at(events, interval).get_epsilon_for_delta(delta))
    if math.isinf(epsilon):
        finer = interval / 3
    elif epsilon < predicted / 1.2:
        finer = _grid_for(events, epsilon, lam)
    else:
        return epsilon, interval
    if finer >= interval or interval <= finest:
        return epsilon, interval
    finer = max(finer, finest)
    return min(epsilon, float(pld_at(events, finer).get_epsilon_for_delta(delta))), finer


def _refined_by_levels(events: tuple[Event, ...], delta: float, span: float) -> tuple[float, float]:
    """h from coarse to fine until the excess the last two levels imply (∝ h²) is under PLD_TOLERANCE of
    ε; ``span``: about the largest privacy loss that matters (RDP's ε), which bounds the grid."""
    finest = max(PLD_FINEST, span / PLD_MAX_POINTS)
    interval, best = max(PLD_COARSEST, finest), math.inf
    previous = None  # (h, ε) of the level before
    while True:
        epsilon = float(pld_at(events, interval).get_epsilon_for_delta(delta))
        best = min(best, epsilon)
        if previous is None:
            finer = interval / 3
        elif math.isinf(epsilon):  # (ε = inf, a sound bound) the grid cannot hold the losses that matter
            if math.isinf(previous[1]):  # twice running: a finer grid will not either
                return best, interval
            finer = interval / 3
        else:
            ratio = previous[0] / interval
            excess = max(previous[1] - epsilon, 0.0) / (ratio ** 2 - 1)  # ε(h) - tight, if excess ∝ h²
            if excess <= LEVELS_TOLERANCE * epsilon:
                return best, interval
            finer = interval * min(math.sqrt(LEVELS_TOLERANCE / 2 * epsilon / excess), 1 / 1.5)
        if interval <= finest:
            return best, interval
        previous, interval = (interval, epsilon), max(finer, finest)


def pld_epsilon_at(events: Sequence[Event], delta: float, interval: float) -> float:
    """ε at ``delta`` of one PLD at a fixed h: an upper bound at any h (the σ search and the ε curve
    use the h :func:`refined_pld` chose for the final figure)."""
    return float(pld_at(tuple(events), interval).get_epsilon_for_delta(delta))


def orders_near(alpha: float) -> tuple[float, ...]:
    """The integer RDP orders either side of ``alpha`` (at least 2): RDP's ε at a few orders is an upper
    bound on its ε at all, and integer orders are dp_accounting's fastest."""
    return tuple(sorted({float(max(2, math.floor(alpha))), float(max(2, math.ceil(alpha)))}))


def split_candidates(events: Sequence[Event], delta: float) -> list[Spend]:
    """PLD for the standard events plus RDP for the custom curves, for each fixed split of δ."""
    standard = [e for e in events if e.supports_pld]
    custom = [e for e in events if not e.supports_pld]
    if not standard:
        return []
    spent = sum(e.delta for e in custom if isinstance(e, RdpCurveEvent))
    pld = refined_pld(standard, delta / 2)[0]  # one PLD, read at each δ₁
    return [Spend(float(pld.get_epsilon_for_delta(delta * (1 - share))) + rdp_epsilon(tuple(custom), delta * share),
                  delta, "pld+rdp")
            for share in SPLIT_DELTA_SHARES if delta * share > spent]


def classic_rdp_epsilon(events: Sequence[Event], *, delta: float) -> float:
    """ε from the original moments-accountant conversion ε = min_α RDP(α) + log(1/δ)/(α−1).

    Kept only to reproduce published figures (Abadi et al. 2016 report 1.26 and
    2.55); it is looser than the conversion :func:`compute_epsilon` uses, so the
    product never reports it.
    """
    rdp = _rdp_curve(events)
    return float(min(r + math.log(1 / delta) / (a - 1) for a, r in zip(RDP_ORDERS, rdp)))


def composed_steps(events: Sequence[Event]) -> int:
    """The mechanism steps the events compose (a PLD past PLD_MAX_STEPS takes minutes to terabytes)."""
    return sum(getattr(e, "steps", 1) for e in events)


def clear_caches() -> None:
    """Forget the cached RDP curves, PLDs and ε (for timings that must start cold)."""
    for cached in (event_rdp, rdp_epsilon, pld_at, saddle_point, refined_pld_epsilon):
        cached.cache_clear()

