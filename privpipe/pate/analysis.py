"""Privacy of PATE's noisy aggregation: data-independent, data-dependent and sanitised.

    spec = AggregatorSpec(mechanism="confident_gnmax", teachers=250, classes=10,
                          threshold=200, sigma1=150, sigma2=40)
    events = data_independent_events(spec, queries=640, answered=int((labels >= 0).sum()))
    raw = data_dependent_rdp(spec, histograms, labels >= 0, orders=RDP_ORDERS)   # private: never release
    release = sanitise(spec, histograms, labels >= 0, order=20, beta=0.01, noise_scale=20,
                       failure_probability=1e-7, noise=NoiseSource(seed=0, secure=True))
    ledger.record(release.event())                                                   # what the ledger composes

Adjacency: one record added or removed changes one teacher (the partition assigns each
record by its own id, see ``privpipe.data.partition``), so every query's histogram moves
by at most one vote: one count −1, another +1.

**Data-independent.** LNMax: two Laplace(1/γ) coordinates change by 1 (two Laplace events per
query). GNMax: a Gaussian of L2 sensitivity √2 (noise multiplier σ/√2). The threshold of
Confident-GNMax: the top count has sensitivity 1 (noise multiplier σ₁). These are standard
events, so the ledger can use PLD for them.

**Data-dependent** (Papernot et al. 2018, Theorem 6; 2017, Theorem 3). If a mechanism's
output differs from its likely outcome with probability at most q̃, its RDP at order λ is
bounded by a function of q̃ that goes to 0 with q̃. We bound q̃ by the gap between the
top two counts alone — q̃ ≤ (m−1)·Pr[N(0, 2σ²) ≥ gap] for GNMax (Prop. 7 with every
other gap replaced by the smallest), (m−1)(2 + γ·gap)/(4e^{γ·gap}) for LNMax — and, for the
threshold, by min(Pr[answer], Pr[no answer]) from the top count. Each per-query bound is
capped by the data-independent RDP, so it never exceeds it. The threshold costs on every
query; the noisy argmax only on answered ones (realised outcomes, as in the paper's
reported figures: the data-dependent figure is a statement about this dataset and its
run; weighting by the probability of answering would under-count, since
E[e^X] ≥ e^{E[X]}). The data-independent bound, by contrast, should be charged for every
query asked (``answered=queries``): the pipeline does so.

**Sanitised release** (2018, §4 and Theorem 23). The data-dependent value F(D) depends on
the data, so it is released as U = F + SS·(c·σ_s + N(0, σ_s²)) with SS a β-smooth bound on
F's local sensitivity and c = Φ⁻¹(1 − p): U ≥ F except with probability p, which the
ledger takes out of δ. Because the per-query bounds depend only on the gap (moves ≤ 2 per
changed teacher) and the top count (moves ≤ 1), the local sensitivity at distance d is a
sliding-window maximum over tabulated values — exact bookkeeping, no monotonicity
assumptions. The shift by c·σ_s·SS is itself GNSS with a smooth bound inflated by
(1 + c·σ_s·(e^β − 1)), and that is what the release cost is computed for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from scipy.special import log_ndtr, ndtri

from privpipe.pate.aggregate import MECHANISMS
from privpipe.privacy.events import Event, GaussianEvent, LaplaceEvent, RdpCurveEvent
from privpipe.privacy.secure_noise import NoiseSource

__all__ = ["AggregatorSpec", "SanitisedRelease", "data_independent_events", "data_independent_rdp",
           "per_query_rdp", "data_dependent_rdp", "local_sensitivity_by_distance", "smooth_sensitivity",
           "gnss_rdp", "release_cost", "planned_release_event", "sanitise", "gaussian_rdp", "laplace_rdp", "vote_statistics"]

#: q̃ is floored at e^-1000 (q̃ enters only as an upper bound, so raising it is safe; below, exp underflows)
_LOG_Q_FLOOR = -1000.0


@dataclass(frozen=True)
class AggregatorSpec:
    """The aggregator as the analysis sees it: mechanism, ensemble size, classes, noise."""

    mechanism: str
    teachers: int
    classes: int
    gamma: float | None = None  # lnmax: Laplace inverse scale
    sigma: float | None = None  # gnmax
    threshold: float | None = None  # confident_gnmax: T
    sigma1: float | None = None  # confident_gnmax: threshold noise
    sigma2: float | None = None  # confident_gnmax: argmax noise

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism: unknown {self.mechanism!r} (choose one of {', '.join(MECHANISMS)})")
        if self.teachers < 1 or self.classes < 2:
            raise ValueError(f"need teachers >= 1 and classes >= 2, got {self.teachers} and {self.classes}")
        needed = {"lnmax": ("gamma",), "gnmax": ("sigma",),
                  "confident_gnmax": ("threshold", "sigma1", "sigma2")}[self.mechanism]
        for name in needed:
            value = getattr(self, name)
            if value is None or (name != "threshold" and not value > 0):
                raise ValueError(f"{name} must be > 0 for {self.mechanism}, got {value!r}")

    @property
    def argmax_sigma(self) -> float:
        return float(self.sigma if self.mechanism == "gnmax" else self.sigma2)


# -- per-query bounds on Pr[output ≠ likely outcome] ---------------------------------

def vote_statistics(histograms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gap between the top two counts, top count) per query, as integers."""
    counts = np.sort(np.asarray(histograms), axis=1)
    return (counts[:, -1] - counts[:, -2]).astype(np.int64), counts[:, -1].astype(np.int64)


def _cap_logq(logq: np.ndarray, classes: int) -> np.ndarray:
    # the plurality class wins a symmetric noisy max with probability ≥ 1/m
    return np.clip(logq, _LOG_Q_FLOOR, math.log1p(-1.0 / classes))


def _logq_gnmax(gaps: np.ndarray, *, sigma: float, classes: int) -> np.ndarray:
    return _cap_logq(math.log(classes - 1) + log_ndtr(-gaps / (math.sqrt(2.0) * sigma)), classes)


def _logq_lnmax(gaps: np.ndarray, *, gamma: float, classes: int) -> np.ndarray:
    scaled = gamma * gaps
    return _cap_logq(math.log(classes - 1) + np.log((2.0 + scaled) / 4.0) - scaled, classes)


def _logq_threshold(tops: np.ndarray, *, threshold: float, sigma1: float) -> np.ndarray:
    log_answer = log_ndtr((tops - threshold) / sigma1)
    log_silent = log_ndtr((threshold - tops) / sigma1)
    return np.maximum(np.minimum(log_answer, log_silent), _LOG_Q_FLOOR)


# -- RDP of one query given q̃ --------------------------------------------------------

def gaussian_rdp(logq: np.ndarray, *, sigma: float, order: float) -> np.ndarray:
    """RDP at ``order`` of a mechanism that is (μ, μ/σ²)-RDP for all μ, given log q̃ (Theorem 6).

    GNMax with noise σ is such a mechanism; so is the threshold with σ = √2·σ₁. The result
    is the smaller of the data-dependent and the data-independent bound λ/σ².
    """
    logq = np.atleast_1d(np.asarray(logq, dtype=np.float64))
    independent = order / sigma**2
    out = np.full(logq.shape, independent)
    mu2 = sigma * np.sqrt(-logq)
    mu1 = mu2 + 1.0
    eps1, eps2 = mu1 / sigma**2, mu2 / sigma**2
    with np.errstate(divide="ignore", invalid="ignore"):
        # Theorem 6's conditions: λ ≤ μ1, μ2 > 1, q̃·e^{ε2} < 1 and the bound on q̃ (Lemma 9)
        valid = (mu1 >= order) & (mu2 > 1.0) & (-logq > eps2)
        valid &= logq <= (mu2 - 1.0) * eps2 - mu2 * np.log(mu1 / (mu1 - 1.0) * mu2 / (mu2 - 1.0))
        log1q = np.log1p(-np.exp(logq))
        log_a = (order - 1.0) * (log1q - np.log1p(-np.exp((logq + eps2) * (1.0 - 1.0 / mu2))))
        log_b = (order - 1.0) * (eps1 - logq / (mu1 - 1.0))
        dependent = np.logaddexp(log1q + log_a, logq + log_b) / (order - 1.0)
    use = valid & np.isfinite(dependent)
    out[use] = np.minimum(independent, dependent[use])
    return out


def _laplace_independent_rdp(gamma: float, order: float) -> float:
    accountant = rdp_privacy_accountant.RdpAccountant(orders=[order])
    accountant.compose(dp_event.LaplaceDpEvent(1.0 / gamma), 2)  # two coordinates move by one
    return float(accountant.rdp[0])


def laplace_rdp(logq: np.ndarray, *, gamma: float, order: float) -> np.ndarray:
    """RDP at ``order`` of LNMax given log q̃ (Papernot et al. 2017, Theorem 3, as RDP of
    order λ = l + 1), capped by the data-independent RDP of the two Laplace coordinates."""
    logq = np.atleast_1d(np.asarray(logq, dtype=np.float64))
    independent = _laplace_independent_rdp(gamma, order)
    out = np.full(logq.shape, independent)
    moments = order - 1.0
    valid = np.exp(logq) < 1.0 / (math.exp(min(2 * gamma, 700.0)) + 1.0)  # = (e^2γ − 1)/(e^4γ − 1), no overflow
    with np.errstate(divide="ignore", invalid="ignore"):
        log1q = np.log1p(-np.exp(logq))
        log_first = log1q + moments * (log1q - np.log1p(-np.exp(2 * gamma + logq)))
        dependent = np.logaddexp(log_first, logq + 2 * gamma * moments) / moments
    use = valid & np.isfinite(dependent)
    out[use] = np.minimum(independent, dependent[use])
    return out


# -- per-query steps as tables over their vote statistic ----------------------------

@dataclass(frozen=True)
class _Step:
    """One noisy step of every query: its RDP as a table over an integer vote statistic."""

    statistic: str  # "gap" (top two counts) or "top" (top count)
    radius: int  # how far one changed teacher can move the statistic
    every_query: bool  # threshold: all queries; argmax: answered ones


def _steps(spec: AggregatorSpec) -> list[_Step]:
    argmax = _Step("gap", 2, every_query=spec.mechanism != "confident_gnmax")
    return [_Step("top", 1, every_query=True), argmax] if spec.mechanism == "confident_gnmax" else [argmax]


def _table(spec: AggregatorSpec, step: _Step, order: float) -> np.ndarray:
    values = np.arange(spec.teachers + 1, dtype=np.float64)
    if step.statistic == "top":
        logq = _logq_threshold(values, threshold=spec.threshold, sigma1=spec.sigma1)
        return gaussian_rdp(logq, sigma=math.sqrt(2.0) * spec.sigma1, order=order)
    if spec.mechanism == "lnmax":
        return laplace_rdp(_logq_lnmax(values, gamma=spec.gamma, classes=spec.classes), gamma=spec.gamma, order=order)
    sigma = spec.argmax_sigma
    return gaussian_rdp(_logq_gnmax(values, sigma=sigma, classes=spec.classes), sigma=sigma, order=order)


def _check_votes(spec: AggregatorSpec, histograms: np.ndarray, answered: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = np.asarray(histograms)
    if counts.ndim != 2 or counts.shape[1] != spec.classes:
        raise ValueError(f"histograms must be (queries, {spec.classes}), got shape {counts.shape}")
    if (counts < 0).any() or not np.array_equal(counts, np.round(counts)):
        raise ValueError("histograms: vote counts must be whole numbers >= 0")
    if not (counts.sum(axis=1) == spec.teachers).all():
        raise ValueError(f"every histogram must sum to the {spec.teachers} teachers")
    mask = np.asarray(answered, dtype=bool)
    if mask.shape != (len(counts),):
        raise ValueError(f"answered must be a boolean vector of length {len(counts)}")
    if spec.mechanism != "confident_gnmax" and not mask.all():
        raise ValueError(f"{spec.mechanism} answers every query")
    return counts, mask


def _applies(step: _Step, answered: np.ndarray) -> np.ndarray:
    return np.ones_like(answered) if step.every_query else answered


def per_query_rdp(spec: AggregatorSpec, histograms: np.ndarray, answered: np.ndarray, *,
                  orders: Sequence[float]) -> np.ndarray:
    """Data-dependent RDP of each query at each order: array (queries, orders)."""
    counts, mask = _check_votes(spec, histograms, answered)
    stats = dict(zip(("gap", "top"), vote_statistics(counts)))
    out = np.zeros((len(counts), len(orders)))
    for j, order in enumerate(orders):
        for step in _steps(spec):
            out[:, j] += _table(spec, step, order)[stats[step.statistic]] * _applies(step, mask)
    return out


def data_dependent_rdp(spec: AggregatorSpec, histograms: np.ndarray, answered: np.ndarray, *,
                       orders: Sequence[float]) -> np.ndarray:
    """Total data-dependent RDP at each order. Private: depends on the votes; never release it raw."""
    return per_query_rdp(spec, histograms, answered, orders=orders).sum(axis=0)


def data_independent_events(spec: AggregatorSpec, *, queries: int, answered: int,
                            stage: str = "aggregate") -> list[Event]:
    """Ledger events of the data-independent bound for ``queries`` asked and ``answered`` answered."""
    if not 0 <= answered <= queries:
        raise ValueError(f"answered ({answered}) must be between 0 and queries ({queries})")
    events: list[Event] = []
    if spec.mechanism == "confident_gnmax" and queries:
        events.append(GaussianEvent(stage=stage, noise_multiplier=spec.sigma1, count=queries))
    if answered and spec.mechanism == "lnmax":
        events.append(LaplaceEvent(stage=stage, noise_multiplier=1.0 / spec.gamma, count=2 * answered))
    elif answered:
        events.append(GaussianEvent(stage=stage, noise_multiplier=spec.argmax_sigma / math.sqrt(2.0), count=answered))
    return events


def data_independent_rdp(spec: AggregatorSpec, *, queries: int, answered: int, orders: Sequence[float]) -> np.ndarray:
    """RDP curve of :func:`data_independent_events` at ``orders``."""
    events = data_independent_events(spec, queries=queries, answered=answered)
    accountant = rdp_privacy_accountant.RdpAccountant(orders=list(orders))
    if events:
        accountant.compose(dp_event.ComposedDpEvent([e.to_dp_event() for e in events]))
    return np.asarray(accountant.rdp, dtype=np.float64)


# -- smooth sensitivity and the sanitised release ---------------------------------

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


def local_sensitivity_by_distance(spec: AggregatorSpec, histograms: np.ndarray, answered: np.ndarray, *,
                                  order: float) -> np.ndarray:
    """LS(d), d = 0..teachers: a bound on the local sensitivity of the data-dependent RDP at ``order``
    for every dataset within d changed records (hence teachers) of this one.

    Each query's statistic moves at most ``radius`` per changed teacher, so at distance d it
    lies within radius·d of today's value, and the most one more teacher can then change
    the query's RDP is the largest one-step change in that window.
    """
    counts, mask = _check_votes(spec, histograms, answered)
    stats = dict(zip(("gap", "top"), vote_statistics(counts)))
    size = spec.teachers + 1
    ls = np.zeros(size)
    for step in _steps(spec):
        population = np.bincount(stats[step.statistic][_applies(step, mask).astype(bool)], minlength=size)
        window = _one_step_change(_table(spec, step, order), step.radius)
        for d in range(size):
            ls[d] += population @ window
            window = _dilate(window, step.radius)
    return ls


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


def planned_release_event(spec: AggregatorSpec, *, queries: int, order: float, beta: float, noise_scale: float,
                          failure_probability: float, stage: str = "aggregate") -> RdpCurveEvent:
    """The most a sanitised release for ``queries`` queries can record (every query answered, U at its
    data-independent cap): what the budget is checked against before any noise is drawn."""
    cap = float(data_independent_rdp(spec, queries=queries, answered=queries, orders=[order])[0])
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


def sanitise(spec: AggregatorSpec, histograms: np.ndarray, answered: np.ndarray, *, order: float, beta: float,
             noise_scale: float, failure_probability: float, noise: NoiseSource) -> SanitisedRelease:
    """Release the data-dependent RDP at ``order`` through the smooth-sensitivity Gaussian mechanism."""
    if not 0 < failure_probability < 0.5:
        raise ValueError(f"failure_probability must be in (0, 0.5), got {failure_probability!r}")
    if not noise_scale > 0:
        raise ValueError(f"noise_scale must be > 0, got {noise_scale!r}")
    counts, mask = _check_votes(spec, histograms, answered)
    raw = float(data_dependent_rdp(spec, counts, mask, orders=[order])[0])
    smooth = smooth_sensitivity(local_sensitivity_by_distance(spec, counts, mask, order=order), beta=beta)
    shift = float(-ndtri(failure_probability))  # c: U falls below F only if N(0,1) < −c
    cost = release_cost(order=order, beta=beta, noise_scale=noise_scale, failure_probability=failure_probability)
    independent = float(data_independent_rdp(spec, queries=len(counts), answered=int(mask.sum()), orders=[order])[0])
    noisy = raw + smooth * noise_scale * (shift + float(noise.normal((1,), std=1.0)[0]))
    # clipping to [0, data-independent] is post-processing and keeps U ≥ F whenever it held
    released = min(max(noisy, 0.0), independent)
    return SanitisedRelease(order=float(order), released=released, release_cost=cost, data_independent=independent,
                            failure_probability=failure_probability, beta=beta, noise_scale=noise_scale,
                            raw=raw, smooth_sensitivity=smooth)
