"""Privacy of PATE's noisy aggregation: data-independent, data-dependent and sanitised.

    aggregator = make_aggregator("confident_gnmax", 250, 10,
                                 threshold=200, sigma1=150, sigma2=40)  # privpipe.pate.aggregators
    choice = choose_analysis(aggregator, queries=640, order=20, beta=0.01, noise_scale=20,
                             failure_probability=1e-7, epsilon_of=ledger_epsilon_after)  # public: before the votes
    events = data_independent_events(aggregator, queries=640)
    raw = data_dependent_rdp(aggregator, histograms, orders=RDP_ORDERS)        # private: never release
    release = sanitise(aggregator, histograms, order=20, beta=0.01, noise_scale=20,
                       failure_probability=1e-7, noise=NoiseSource(seed=0, secure=True))
    ledger.record(release.event())                                       # what the ledger composes

Adjacency: one record added or removed changes one teacher (the partition assigns each
record by its own id, see ``privpipe.data.partition``), so every query's histogram moves
by at most one vote: one count −1, another +1.

Every function here takes the aggregator as an object (privpipe.pate.aggregators: LNMax, GNMax,
ConfidentGNMax), which says what is particular to it; what follows holds for all of them.

**Data-independent.** Each aggregator's own events (its class says which). Every query asked is
charged, answered or not. These are standard events, so the ledger can use PLD for them.

**Data-dependent** (Papernot et al. 2018, Theorem 6; 2017, Theorem 3), with the reference
code's formulas (tensorflow/privacy, research/pate_2018/core.py; here in
privpipe.pate.query_rdp): q̃, a bound on the probability that the noisy argmax is not the
plurality class, is the union bound over every other class (2018 Prop. 7 for GNMax, 2017
Lemma 4 for LNMax), capped at 1 − 1/m; the threshold's q̃ is min(Pr[answer], Pr[no answer])
from the top count. Per query the RDP is the Theorem 6 (Theorem 3) bound at q̃, never above
the data-independent one: the argmax step's, plus the threshold step's where the aggregator
has one, **both charged on every query asked** (ConfidentGNMax's docstring says why).

The bounds are those of Theorem 6 and Theorem 3: D_λ(M(D) ‖ M(D′)) for every neighbour D′
of the dataset D at hand, the direction the papers and their code bound.

**Choice** (:func:`choose_analysis`). The sanitised release costs more than the bound it
releases: its own GNSS cost, and the shift c·σ_s·SS that makes it an upper bound. So
before any vote is seen it is checked whether data-dependent accounting can win at all:
its expected release at the best of a public family of votes (every query alike, each
possible top count, unanimous included) against the data-independent events (the
reference code's ``is_data_independent_always_opt_*`` test, extended by the release's
costs and the δ conversion).

**Sanitised release** (2018, §4 and Theorem 23). The data-dependent value F(D) depends on
the data, so it is released as U = F + SS·(c·σ_s + N(0, σ_s²)) with SS a β-smooth bound on
F's local sensitivity and c = Φ⁻¹(1 − p): U ≥ F except with probability p, which the
ledger takes out of δ. The local sensitivity at distance d (2018 Prop. 13 and Algorithms 3–5,
each step proved here rather than assumed): one changed teacher moves every sorted gap to the
top by at most 2, so a neighbour's q̃ lies in [B_l(q̃), B_u(q̃)] (Jensen over the union bound's
terms: :func:`privpipe.pate.query_rdp.gnmax_neighbour_logq`); within d teachers q̃ lies between
the union bounds of the gaps the top's gaining d votes from the others allows (water-filling, the
least) and its losing d to the nearest class (the most). One more teacher then changes the
argmax's RDP β by at most max(β(B_u(q)) − β(q), β(q) − β(B_l(q))) over that interval, its
neighbours held within the interval at d + 1. The maximum over the interval is taken at the
points where it can lie when β and the two differences have the shape Algorithm 3 rests on
(checked per setting on a grid of 200,001 values, as the reference checks its conditions C5/C6
numerically), else cell by cell over that grid (needs only β non-decreasing; otherwise the bound
falls back to the data-independent RDP). On MNIST's votes (σ 40, order 20) the smooth
sensitivity is at most the reference code's (tests/library/pate/test_pate_analysis.py). The threshold depends
on the top count alone (moves ≤ 1 per teacher): an exact sliding-window maximum over its table.
The shift by c·σ_s·SS is itself GNSS with a smooth bound inflated by (1 + c·σ_s·(e^β − 1)), and
that is what the release cost is computed for.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from scipy.special import ndtri

from privpipe.pate.aggregators import Aggregator
from privpipe.pate.query_rdp import (
    cap_logq,
    gaussian_rdp,
    laplace_rdp,
    logpr_answered,
    logq_gnmax,
    logq_lnmax,
    threshold_rdp,
    top_gaps,
)
from privpipe.privacy.events import Event, RdpCurveEvent
from privpipe.privacy.secure_noise import NoiseSource

# the per-query formulas are re-exported: callers have always found them here
__all__ = ["AnalysisChoice", "SanitisedRelease", "data_independent_events", "data_independent_rdp",
           "logq_gnmax", "logq_lnmax", "logpr_answered", "gaussian_rdp", "laplace_rdp", "threshold_rdp",
           "per_query_rdp", "data_dependent_rdp", "best_case_rdp", "choose_analysis", "local_sensitivity_by_distance",
           "smooth_sensitivity", "gnss_rdp", "release_cost", "planned_release_event", "sanitise"]


# -- per-query and total data-dependent RDP -----------------------------------------

def _argmax_rdp_at(aggregator: Aggregator, logq: np.ndarray, order: float) -> np.ndarray:
    """The argmax step's RDP at ``order`` given log q̃ (capped first, as the union bounds are)."""
    return aggregator.argmax_rdp(cap_logq(logq, aggregator.classes), order=order)


def _argmax_rdp_from_gaps(aggregator: Aggregator, gaps: np.ndarray, order: float) -> np.ndarray:
    return _argmax_rdp_at(aggregator, aggregator.argmax_logq(gaps), order)


def _check_votes(aggregator: Aggregator, histograms: np.ndarray) -> np.ndarray:
    counts = np.asarray(histograms)
    if counts.ndim != 2 or counts.shape[1] != aggregator.classes:
        raise ValueError(f"histograms must be (queries, {aggregator.classes}), got shape {counts.shape}")
    if (counts < 0).any() or not np.array_equal(counts, np.round(counts)):
        raise ValueError("histograms: vote counts must be whole numbers >= 0")
    if not (counts.sum(axis=1) == aggregator.teachers).all():
        raise ValueError(f"every histogram must sum to the {aggregator.teachers} teachers")
    return counts.astype(np.int64)


def per_query_rdp(aggregator: Aggregator, histograms: np.ndarray, *, orders: Sequence[float]) -> np.ndarray:
    """Data-dependent RDP of each query asked at each order: array (queries, orders).

    With a threshold step (Confident-GNMax): threshold plus argmax on every query (see the module docstring).
    """
    counts = _check_votes(aggregator, histograms)
    gaps = top_gaps(counts)
    out = np.zeros((len(counts), len(orders)))
    for j, order in enumerate(orders):
        out[:, j] = _argmax_rdp_from_gaps(aggregator, gaps, order)
        threshold = aggregator.threshold_rdp_table(order=order)
        if threshold is not None:
            out[:, j] += threshold[counts.max(axis=1)]
    return out


def data_dependent_rdp(aggregator: Aggregator, histograms: np.ndarray, *, orders: Sequence[float]) -> np.ndarray:
    """Total data-dependent RDP at each order. Private: depends on the votes; never release it raw."""
    total: np.ndarray = per_query_rdp(aggregator, histograms, orders=orders).sum(axis=0)
    return total


def data_independent_events(aggregator: Aggregator, *, queries: int, stage: str = "aggregate") -> list[Event]:
    """Ledger events of the data-independent bound for ``queries`` queries asked (every one charged)."""
    if queries < 0:
        raise ValueError(f"queries must be >= 0, got {queries}")
    if queries == 0:
        return []
    return aggregator.data_independent_events(queries=queries, stage=stage)


def data_independent_rdp(aggregator: Aggregator, *, queries: int, orders: Sequence[float]) -> np.ndarray:
    """RDP curve of :func:`data_independent_events` at ``orders``."""
    events = data_independent_events(aggregator, queries=queries)
    accountant = rdp_privacy_accountant.RdpAccountant(orders=list(orders))
    if events:
        accountant.compose(dp_event.ComposedDpEvent([e.to_dp_event() for e in events]))
    return np.asarray(accountant.rdp, dtype=np.float64)


# -- the choice, from public information only -------------------------------------------

def _identical_votes(aggregator: Aggregator) -> np.ndarray:
    """For every possible top count t, the histogram t, t, …, remainder: the most agreement a top count allows."""
    teachers, classes = aggregator.teachers, aggregator.classes
    rows = []
    for top in range(-(-teachers // classes), teachers + 1):  # pigeonhole: top ≥ ⌈teachers/m⌉
        full, rest = divmod(teachers, top)
        row = [top] * full + ([rest] if rest else [])
        rows.append(row + [0] * (classes - len(row)))
    return np.array(rows, dtype=np.int64)


def best_case_rdp(aggregator: Aggregator, *, queries: int, order: float, beta: float, noise_scale: float,
                  failure_probability: float) -> float:
    """The smallest RDP a sanitised release of ``queries`` queries can be expected to record, over votes where
    every query has the same histogram (each possible top count, the rest as concentrated as it allows):
    the data-dependent bound plus the shift c·σ_s·SS that keeps it an upper bound, capped at the
    data-independent RDP, plus the release's own cost. Depends only on the settings; unanimous votes are
    among the histograms tried, so the bound's own minimum (without the shift) is never missed."""
    counts = _identical_votes(aggregator)
    raw = per_query_rdp(aggregator, counts, orders=[order])[:, 0]
    rows = _local_sensitivity_rows(aggregator, counts, order)
    smooth = np.array([smooth_sensitivity(row, beta=beta) for row in rows])
    shift = float(-ndtri(failure_probability))
    cap = float(data_independent_rdp(aggregator, queries=queries, orders=[order])[0])
    expected = np.minimum(queries * (raw + shift * noise_scale * smooth), cap)
    return float(expected.min()) + release_cost(order=order, beta=beta, noise_scale=noise_scale,
                                                failure_probability=failure_probability)


@dataclass(frozen=True)
class AnalysisChoice:
    """Which analysis the ledger records, decided before any vote is seen, and why."""

    analysis: str  # "data_dependent" | "data_independent"
    reason: str
    #: the sanitised release's ε at its best case (:func:`best_case_rdp`); None where the run's accountant cannot
    #: compose an RDP curve (privacy.accountant: pld), so none is recorded or measured
    best_case_epsilon: float | None
    data_independent_epsilon: float

    def public(self) -> dict[str, float | str | None]:
        return dict(self.__dict__)


def choose_analysis(aggregator: Aggregator, *, queries: int, order: float, beta: float, noise_scale: float,
                    failure_probability: float, epsilon_of: Callable[[list[Event]], float]) -> AnalysisChoice:
    """Data-dependent only if its best case beats the data-independent events, as ``epsilon_of`` measures
    them (e.g. the run's ε after composing them with the ledger). Public: settings and query count only."""
    best = best_case_rdp(aggregator, queries=queries, order=order, beta=beta, noise_scale=noise_scale,
                         failure_probability=failure_probability)
    best_epsilon = epsilon_of([RdpCurveEvent(stage="aggregate", orders=(order,), rdp=(best,),
                                             delta=failure_probability)])
    independent_epsilon = epsilon_of(data_independent_events(aggregator, queries=queries))
    if best_epsilon < independent_epsilon:
        return AnalysisChoice("data_dependent", f"can win: best case ε {best_epsilon:.4g} < data-independent ε "
                              f"{independent_epsilon:.4g}", best_epsilon, independent_epsilon)
    return AnalysisChoice("data_independent", f"data-dependent cannot win: even at its best case ε "
                          f"{best_epsilon:.4g} (release cost included) ≥ data-independent ε {independent_epsilon:.4g}",
                          best_epsilon, independent_epsilon)


# -- smooth sensitivity and the sanitised release ---------------------------------

#: cell edges in log q̃, from −100,000 up to −1e−6, finer where q̃ is large (uniform in log(−log q̃))
_LOGQ_EDGES = -np.geomspace(1e5, 1e-6, 200001)


@dataclass(frozen=True)
class _ArgmaxGrid:
    """The argmax's RDP β on the edges of log q̃, and at each edge's neighbour bounds B_l, B_u."""

    edges: np.ndarray
    at: np.ndarray  # β(edge)
    at_low: np.ndarray  # β(B_l(edge))
    at_high: np.ndarray  # β(B_u(edge))


@functools.lru_cache(maxsize=8)
def _argmax_grid(aggregator: Aggregator, order: float) -> _ArgmaxGrid | None:
    """β on the grid, or None where it is not non-decreasing in q̃ on the edges (then no interval bound
    holds; the reference code checks its own conditions C5/C6 numerically the same way)."""
    edges = cap_logq(_LOGQ_EDGES, aggregator.classes)
    values = _argmax_rdp_at(aggregator, edges, order)
    if not (np.diff(values) >= -1e-12).all():
        return None
    low, high = aggregator.argmax_neighbour_logq(edges)
    return _ArgmaxGrid(edges=edges, at=values, at_low=_argmax_rdp_at(aggregator, low, order),
                       at_high=_argmax_rdp_at(aggregator, high, order))


@functools.lru_cache(maxsize=8)
def _argmax_step_table(aggregator: Aggregator, order: float) -> tuple[np.ndarray, np.ndarray]:
    """Per cell of log q̃ (cell 0 up to the first edge, cell k between edges k − 1 and k), a bound on how
    much one changed teacher can change β from any q̃ in the cell [a, b]: max(β(B_u(b)) − β(a),
    β(b) − β(B_l(a))), with [B_l, B_u] the neighbours' range of q̃ (``aggregator.argmax_neighbour_logq``),
    as a sparse table for range maxima. Needs :func:`_argmax_grid` to hold."""
    grid = _argmax_grid(aggregator, order)
    if grid is None:
        raise ValueError("no cell bounds: the argmax's RDP is not non-decreasing in q̃ on the grid")
    up = grid.at_high - np.r_[0.0, grid.at[:-1]]  # from a (β(−∞) = 0) up to B_u(b)
    down = grid.at[1:] - grid.at_low[:-1]  # from b down to B_l(a)
    cells = np.maximum(up, np.r_[0.0, down])
    levels = [cells]
    while 2 ** len(levels) <= len(cells):
        width = 2 ** (len(levels) - 1)
        previous = levels[-1]
        levels.append(np.maximum(previous[:-width], previous[width:]))
    table = np.zeros((len(levels), len(cells)))
    for j, level in enumerate(levels):
        table[j, :len(level)] = level
    return grid.edges, table


@functools.lru_cache(maxsize=8)
def _argmax_peaks(aggregator: Aggregator, order: float) -> tuple[float, float] | None:
    """(log q₁, log q₀) when the one-step change has the shape Papernot et al. 2018's Algorithm 3 rests
    on, else None. q₀ is where the argmax's RDP β reaches its data-independent value and q₁ = B_l(q₀)
    (so B_u(q₁) = q₀). Then up(q) = β(B_u(q)) − β(q) is indep − β(q) on [q₁, q₀] and falls, and
    down(q) = β(q) − β(B_l(q)) falls beyond q₀; checked here on the grid, as the reference checks its
    conditions C5/C6 numerically: β non-decreasing, up non-decreasing below q₁, down below q₀."""
    grid = _argmax_grid(aggregator, order)
    if grid is None:
        return None
    edges, values = grid.edges, grid.at
    independent = values[-1]
    reached = np.flatnonzero(values >= independent)
    if reached[0] == 0:
        return None
    below, above = float(edges[reached[0] - 1]), float(edges[reached[0]])
    for _ in range(200):  # bisect to the float: β < indep at `below`, = indep at `above`
        middle = 0.5 * (below + above)
        if middle in (below, above):
            break
        if _argmax_rdp_at(aggregator, np.array([middle]), order)[0] >= independent:
            above = middle
        else:
            below = middle
    logq0 = above
    logq1 = float(aggregator.argmax_neighbour_logq(np.array([logq0]))[0][0])
    up, down = grid.at_high - values, values - grid.at_low
    if not ((np.diff(up[edges < logq1]) >= -1e-12).all() and (np.diff(down[edges < logq0]) >= -1e-12).all()):
        return None
    return logq1, logq0


def _reach_low_gaps(gaps: np.ndarray, distance: int) -> np.ndarray:
    """Gaps whose union bound is at most that of any histogram within ``distance`` teachers.

    The top gains at most d votes and the others lose at most d in all (if another class becomes the
    top, the old top's term takes its place and is no smaller), so q̃ ≥ min Σ_j t(g_j + d + r_j) over
    r ≥ 0, Σr ≤ d. With t convex and decreasing the minimum over real r fills the smallest gaps up to
    one level L (water-filling): Σ_j max(0, L − g_j − d) = d. (The reference's walk moves the votes one
    at a time from the second class to the top: the same up to whole votes.)"""
    raised = np.sort(gaps, axis=1) + float(distance)
    if distance == 0:
        return raised
    filled = np.cumsum(raised, axis=1)
    count = np.arange(1, raised.shape[1] + 1)
    levels = (distance + filled) / count  # the level if the k smallest share the d votes
    # the k that holds: the level reaches the k-th gap and stays below the (k + 1)-th
    below_next = np.c_[levels[:, :-1] <= raised[:, 1:], np.ones((len(raised), 1), dtype=bool)]
    k = np.argmax(below_next & (levels >= raised), axis=1)
    level = levels[np.arange(len(raised)), k]
    low: np.ndarray = np.maximum(raised, level[:, None])
    return low


def _reach_high(aggregator: Aggregator, gaps: np.ndarray, distance: int) -> np.ndarray:
    """An upper bound on log q̃ over the histograms within ``distance`` teachers: the top loses at most d
    votes and the others gain at most d in all, so q̃ ≤ max Σ_j t(g_j − d − k_j) over k ≥ 0, Σk ≤ d, for t
    a union-bound term. t is convex and decreasing for gaps ≥ 0 (Gaussian tail, 2017 Lemma 4's term), so
    while the smallest gap is ≥ 2d the maximum is all of k on it (a vertex; the reference's walk from the
    top to the second class); beyond, every gap − 2d (floored at 0), which is larger still."""
    if distance == 0:
        return aggregator.argmax_logq(gaps)
    vertex = gaps - float(distance)
    vertex[:, 0] -= float(distance)
    spread = np.maximum(gaps - 2.0 * distance, 0.0)
    convex = gaps[:, :1] >= 2.0 * distance
    return aggregator.argmax_logq(np.where(convex, vertex, spread))


def _range_max(table: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """max cells[first..last] (inclusive) per row, from the sparse table."""
    level = np.floor(np.log2(last - first + 1)).astype(np.int64)
    maxima: np.ndarray = np.maximum(table[level, first], table[level, last - 2**level + 1])
    return maxima


def _one_step_change(table: np.ndarray, radius: int) -> np.ndarray:
    """c[v] = max |table[v'] − table[v]| over |v' − v| ≤ radius: the most one teacher can change a query."""
    change = np.zeros_like(table)
    for shift in range(1, radius + 1):
        diff = np.abs(table[shift:] - table[:-shift])
        change[:-shift] = np.maximum(change[:-shift], diff)
        change[shift:] = np.maximum(change[shift:], diff)
    return change


def _dilate(values: np.ndarray, radius: int) -> np.ndarray:
    for _ in range(radius):
        values = np.maximum(values, np.maximum(np.r_[values[1:], values[-1]], np.r_[values[0], values[:-1]]))
    return values


def _one_step_bound(aggregator: Aggregator, low: np.ndarray, high: np.ndarray, order: float,
                    reach: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The most one changed teacher can change the argmax's RDP β from any log q̃ in [low, high] (β
    non-decreasing): max(β(B_u(high)) − β(low), β(high) − β(B_l(low))), with the neighbours' range
    [B_l, B_u] also held within ``reach``, where every neighbour of the histograms considered lies."""
    below, _ = aggregator.argmax_neighbour_logq(low)
    _, above = aggregator.argmax_neighbour_logq(high)
    at_low, at_high = _argmax_rdp_at(aggregator, low, order), _argmax_rdp_at(aggregator, high, order)
    bound: np.ndarray = np.maximum(_argmax_rdp_at(aggregator, np.minimum(above, reach[1]), order) - at_low,
                                   at_high - _argmax_rdp_at(aggregator, np.maximum(below, reach[0]), order))
    return bound


def _unimodal_bound(aggregator: Aggregator, peaks: tuple[float, float], here: tuple[np.ndarray, np.ndarray],
                    reach: tuple[np.ndarray, np.ndarray], order: float) -> np.ndarray:
    """:func:`_one_step_bound` over ``here`` where :func:`_argmax_peaks` holds: each part's maximum lies at
    one of a few points, each bounded on a cell of width ~1e−9 around it (so rounding cannot miss it).
    up, held below β(reach high) − β(q), peaks where B_u(q) = reach high (q = B_l(reach high)) left of q₁,
    else at q₁; down, held below β(q) − β(reach low), rises to q₀, then peaks where B_l(q) = reach low."""
    low, high = here
    logq1, logq0 = peaks
    up_cross = aggregator.argmax_neighbour_logq(reach[1])[0]
    down_cross = aggregator.argmax_neighbour_logq(reach[0])[1]
    candidates = [low, high, np.clip(logq1, low, high), np.clip(logq0, low, high),
                  np.clip(up_cross, low, np.minimum(high, logq1)), np.clip(down_cross, np.maximum(low, logq0), high)]
    bound = np.zeros(len(low))
    for point in candidates:
        width = 1e-9 * (1.0 + np.abs(point))
        piece = _one_step_bound(aggregator, np.maximum(point - width, low), np.minimum(point + width, high), order,
                                reach)
        bound = np.maximum(bound, piece)
    return bound


def _interval_bound(aggregator: Aggregator, steps: tuple[np.ndarray, np.ndarray], here: tuple[np.ndarray, np.ndarray],
                    reach: tuple[np.ndarray, np.ndarray], order: float) -> np.ndarray:
    """:func:`_one_step_bound` over log q̃ in ``here`` = (low, high), per row: exact on the two end pieces
    (the parts of the first and last cells inside the interval), the table's cell bounds in between, no
    more than the change from any q̃ in ``here`` to any in ``reach``."""
    low, high = here
    edges, table = steps
    first = np.minimum(np.searchsorted(edges, low), len(edges) - 1)
    last = np.minimum(np.searchsorted(edges, high), len(edges) - 1)
    first_end = np.where(first == last, high, edges[first])
    last_start = np.where(first == last, low, edges[np.maximum(last - 1, 0)])
    bound: np.ndarray = np.maximum(_one_step_bound(aggregator, low, first_end, order, reach),
                                   _one_step_bound(aggregator, last_start, high, order, reach))
    inner = last - first >= 2
    if inner.any():
        cells = _range_max(table, first[inner] + 1, last[inner] - 1)
        beta = {name: _argmax_rdp_at(aggregator, value[inner], order)
                for name, value in (("low", low), ("high", high), ("reach_low", reach[0]), ("reach_high", reach[1]))}
        whole = np.maximum(beta["reach_high"] - beta["low"], beta["high"] - beta["reach_low"])
        bound[inner] = np.maximum(bound[inner], np.minimum(cells, whole))
    return bound


def _local_sensitivity_rows(aggregator: Aggregator, counts: np.ndarray, order: float) -> np.ndarray:
    """LS(d) of each query's RDP, (queries, teachers + 1): within d teachers q̃ lies between the union
    bounds at :func:`_reach_low_gaps` and :func:`_reach_high`, and their neighbours within the same at
    d + 1; one more teacher then changes the argmax's RDP by at most :func:`_one_step_bound` over that
    interval (Papernot et al. 2018, Prop. 13 and Algorithms 4–5; the interval's maximum taken at
    Algorithm 3's peaks where the shape they need is checked to hold, else cell by cell)."""
    size = aggregator.teachers + 1
    ls = np.zeros((len(counts), size))
    if _argmax_grid(aggregator, order) is None:  # no interval bound: the per-query RDP lies in [0, data-independent]
        ls += float(_argmax_rdp_at(aggregator, np.zeros(1), order)[0])
    else:
        gaps = top_gaps(counts)
        peaks = _argmax_peaks(aggregator, order)
        # at Algorithm 3's peaks where its shape holds, else cell by cell (the table is built only then)
        bound = (functools.partial(_unimodal_bound, aggregator, peaks) if peaks is not None
                 else functools.partial(_interval_bound, aggregator, _argmax_step_table(aggregator, order)))

        def reach(d: int) -> tuple[np.ndarray, np.ndarray]:
            return aggregator.argmax_logq(_reach_low_gaps(gaps, d)), _reach_high(aggregator, gaps, d)

        here = reach(0)
        for d in range(size):
            further = reach(d + 1)
            ls[:, d] = bound(here, further, order)
            here = further
    threshold = aggregator.threshold_rdp_table(order=order)
    if threshold is not None:
        tops = counts.max(axis=1)
        window = _one_step_change(threshold, 1)
        for d in range(size):
            ls[:, d] += window[tops]
            window = _dilate(window, 1)
    return ls


def local_sensitivity_by_distance(aggregator: Aggregator, histograms: np.ndarray, *, order: float) -> np.ndarray:
    """LS(d), d = 0..teachers: a bound on the local sensitivity of the data-dependent RDP at ``order``
    for every dataset within d changed records (hence teachers) of this one (module docstring)."""
    total: np.ndarray = _local_sensitivity_rows(aggregator, _check_votes(aggregator, histograms), order).sum(axis=0)
    return total


def smooth_sensitivity(local_by_distance: np.ndarray, *, beta: float) -> float:
    """β-smooth sensitivity max_d e^{−βd}·LS(d); LS is flat beyond the last distance given."""
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    distances = np.arange(len(local_by_distance))
    return float(np.max(np.exp(-beta * distances) * local_by_distance))


def gnss_rdp(*, beta: float, sigma: float, order: float) -> float:
    """RDP at ``order`` of releasing f + SS_β·N(0, σ²) (Papernot et al. 2018, Theorem 23)."""
    if not beta > 0 or not sigma > 0:
        raise ValueError(f"beta and sigma must be > 0, got {beta!r} and {sigma!r}")
    if not 1 < order < 1 / (2 * beta):
        raise ValueError(f"order {order:g} must be in (1, 1/(2β)) = (1, {1 / (2 * beta):.4g})")
    return order * math.exp(2 * beta) / sigma**2 + (beta * order - 0.5 * math.log(1 - 2 * order * beta)) / (order - 1)


def release_cost(*, order: float, beta: float, noise_scale: float, failure_probability: float) -> float:
    """RDP of publishing U = F + SS·(c·σ_s + N(0, σ_s²)): GNSS for F + c·σ_s·SS, whose β-smooth
    sensitivity bound is SS·(1 + c·σ_s·(e^β − 1)), at noise σ_s / (1 + c·σ_s·(e^β − 1))."""
    shift = float(-ndtri(failure_probability))
    inflation = 1.0 + shift * noise_scale * math.expm1(beta)
    return gnss_rdp(beta=beta, sigma=noise_scale / inflation, order=order)


def planned_release_event(aggregator: Aggregator, *, queries: int, order: float, beta: float, noise_scale: float,
                          failure_probability: float, stage: str = "aggregate") -> RdpCurveEvent:
    """The most a sanitised release for ``queries`` queries can record (U at its data-independent cap):
    what the budget is checked against before any noise is drawn."""
    cap = float(data_independent_rdp(aggregator, queries=queries, orders=[order])[0])
    cost = release_cost(order=order, beta=beta, noise_scale=noise_scale, failure_probability=failure_probability)
    return RdpCurveEvent(stage=stage, orders=(order,), rdp=(cap + cost,), delta=failure_probability)


@dataclass(frozen=True)
class SanitisedRelease:
    """The released data-dependent RDP at one order, and the private values behind it.

    ``raw`` and ``smooth_sensitivity`` depend on the data: keep them out of anything
    published. ``released`` ≥ ``raw`` except with probability ``failure_probability``.
    """

    order: float
    released: float  # U: noisy upper bound on the aggregation's data-dependent RDP at `order`
    release_cost: float  # RDP of publishing U (GNSS)
    data_independent: float  # the data-independent RDP at `order`, for comparison
    failure_probability: float
    beta: float
    noise_scale: float
    raw: float  # private
    smooth_sensitivity: float  # private

    @property
    def rdp(self) -> float:
        """What the aggregation costs at ``order``: the released bound plus the cost of releasing it."""
        return self.released + self.release_cost

    def event(self, stage: str = "aggregate") -> RdpCurveEvent:
        return RdpCurveEvent(stage=stage, orders=(self.order,), rdp=(self.rdp,), delta=self.failure_probability)

    def public(self) -> dict[str, float]:
        return {"order": self.order, "released_rdp": self.released, "release_cost_rdp": self.release_cost,
                "rdp": self.rdp, "data_independent_rdp": self.data_independent,
                "failure_probability": self.failure_probability, "beta": self.beta, "noise_scale": self.noise_scale}


def sanitise(aggregator: Aggregator, histograms: np.ndarray, *, order: float, beta: float,
             noise_scale: float, failure_probability: float, noise: NoiseSource) -> SanitisedRelease:
    """Release the data-dependent RDP at ``order`` through the smooth-sensitivity Gaussian mechanism."""
    if not 0 < failure_probability < 0.5:
        raise ValueError(f"failure_probability must be in (0, 0.5), got {failure_probability!r}")
    if not noise_scale > 0:
        raise ValueError(f"noise_scale must be > 0, got {noise_scale!r}")
    counts = _check_votes(aggregator, histograms)
    raw = float(data_dependent_rdp(aggregator, counts, orders=[order])[0])
    smooth = smooth_sensitivity(local_sensitivity_by_distance(aggregator, counts, order=order), beta=beta)
    shift = float(-ndtri(failure_probability))  # c: U falls below F only if N(0,1) < −c
    cost = release_cost(order=order, beta=beta, noise_scale=noise_scale, failure_probability=failure_probability)
    independent = float(data_independent_rdp(aggregator, queries=len(counts), orders=[order])[0])
    noisy = raw + smooth * noise_scale * (shift + float(noise.normal((1,), std=1.0)[0]))
    # clipping to [0, data-independent] is post-processing and keeps U ≥ F whenever it held
    released = min(max(noisy, 0.0), independent)
    return SanitisedRelease(order=float(order), released=released, release_cost=cost, data_independent=independent,
                            failure_probability=failure_probability, beta=beta, noise_scale=noise_scale,
                            raw=raw, smooth_sensitivity=smooth)
