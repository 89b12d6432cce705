"""PATE's aggregators, one class each behind one interface: the noisy answer and what its analysis needs.

    gnmax = make_aggregator(params.aggregate.mechanism, teachers=250, classes=10)   # the spec params.yaml names
    gnmax = make_aggregator("gnmax", 250, 10, sigma=40.0)    # the same, written as params.yaml would
    labels = gnmax.answer(histograms, noise=NoiseSource(seed=0, secure=False))
    events = gnmax.data_independent_events(queries=640, stage="aggregate")

An aggregator is a noisy vote (privpipe.pate.aggregate) together with what the privacy analysis
(privpipe.pate.analysis) asks of it, so that the analysis holds no case per mechanism:

- the noisy answer: labels from the vote histograms and a NoiseSource (−1: unanswered);
- one query's data-dependent RDP: log q̃ of its argmax step from the gaps to the top count, the
  argmax step's RDP given log q̃, and the threshold step's RDP per top count where it has one;
- the data-independent ledger events of the queries asked (every one charged, answered or not);
- for the local-sensitivity bound: the range of the argmax step's union bound over the histograms
  one changed teacher away.

Adjacency is the analysis module's: one record added or removed changes one teacher, so every
query's histogram moves by at most one vote (one count −1, another +1).

Each class is built from its spec (privpipe.config.aggregate: the noise parameters, their defaults and
ranges, which checking params reads without importing this module), which names it. Adding one: its spec
and its line in privpipe.config.aggregate.AGGREGATORS, and its class here (or in its own module under
privpipe/pate/) reading its noise from ``self.spec``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from privpipe.config.aggregate import AGGREGATORS, AggregatorSpec, ConfidentGNMaxSpec, GNMaxSpec, LNMaxSpec
from privpipe.pate.aggregate import confident_gnmax, confident_mask, gnmax, lnmax
from privpipe.pate.query_rdp import (
    gaussian_rdp,
    gnmax_neighbour_logq,
    laplace_rdp,
    logpr_answered,
    logq_gnmax_from_gaps,
    logq_lnmax_from_gaps,
    threshold_rdp,
)
from privpipe.privacy.events import Event, GaussianEvent, LaplaceEvent

if TYPE_CHECKING:
    from privpipe.privacy.secure_noise import NoiseSource

__all__ = ["Aggregator", "LNMax", "GNMax", "ConfidentGNMax", "make_aggregator"]


def make_aggregator(spec: AggregatorSpec | str | Mapping[str, Any], teachers: int, classes: int,
                    **parameters: float) -> Aggregator:
    """The aggregator ``spec`` names, over ``teachers`` voting on ``classes``. ``spec`` is a parsed
    ``aggregate.mechanism`` (``params.aggregate.mechanism``), or what params.yaml writes there: a name,
    ``{name: {parameter: value}}``, or a name with its parameters as keywords (``make_aggregator("gnmax", 250,
    10, sigma=40.0)``); a parameter not given has its default. An unknown name or parameter is a ConfigError
    naming it."""
    if parameters:
        if not isinstance(spec, str):
            raise TypeError("parameters as keywords go with an aggregator's name, not a spec")
        spec = {spec: parameters}
    parsed = AGGREGATORS.parse(spec)
    aggregator: Aggregator = parsed.load()(teachers, classes, parsed)
    return aggregator


def _check_positive(aggregator: Aggregator, name: str) -> None:
    value = getattr(aggregator.spec, name)
    if value is None or not value > 0:
        raise ValueError(f"{name} must be > 0 for {aggregator.mechanism}, got {value!r}")


@dataclass(frozen=True)
class Aggregator(ABC):
    """The interface: an ensemble of ``teachers`` voting over ``classes``, with the noise its spec sets."""

    teachers: int
    classes: int
    #: its name in params.yaml (aggregate.mechanism) and its noise parameters
    spec: AggregatorSpec

    def __post_init__(self) -> None:
        if self.teachers < 1 or self.classes < 2:
            raise ValueError(f"need teachers >= 1 and classes >= 2, got {self.teachers} and {self.classes}")

    @property
    def mechanism(self) -> str:
        """Its name in params.yaml (aggregate.mechanism)."""
        return self.spec.tag

    def public(self) -> dict[str, Any]:
        """Its name, ensemble and noise, for the stage's analysis file (all public settings)."""
        return {"mechanism": self.mechanism, "teachers": self.teachers, "classes": self.classes,
                **self.spec.parameters()}

    @abstractmethod
    def answer(self, histograms: np.ndarray, *, noise: NoiseSource) -> np.ndarray:
        """The noisy labels of (queries, classes) vote counts, −1 where a query goes unanswered."""

    @abstractmethod
    def argmax_logq(self, gaps: np.ndarray) -> np.ndarray:
        """log q̃ of the argmax step from each query's gaps to the top (its union bound), ≤ log(1 − 1/m)."""

    @abstractmethod
    def argmax_rdp(self, logq: np.ndarray, *, order: float) -> np.ndarray:
        """The argmax step's RDP at ``order`` given log q̃ (≤ log(1 − 1/m)); never above its data-independent
        RDP, and smaller for a smaller q̃."""

    def threshold_rdp_table(self, *, order: float) -> np.ndarray | None:
        """The threshold step's RDP at ``order`` for every possible top count 0..teachers; None without one."""
        return None

    def passes_threshold(self, histograms: np.ndarray, *, noise: NoiseSource) -> np.ndarray:
        """Which queries the threshold step lets through (drawing its noise); all of them without one."""
        return np.ones(len(histograms), dtype=bool)

    @abstractmethod
    def argmax_answer(self, histograms: np.ndarray, *, noise: NoiseSource) -> np.ndarray:
        """The argmax step alone: a noisy label for every query."""

    def gdp_costs(self) -> tuple[float, float] | None:
        """(μ² of the steps every query asked runs, μ² of those only an answered one runs) where each step is
        Gaussian, hence μ-GDP (privpipe.pate.gdp_filter); None otherwise."""
        return None

    @abstractmethod
    def data_independent_events(self, *, queries: int, stage: str) -> list[Event]:
        """Ledger events of the data-independent bound for ``queries`` ≥ 1 queries asked (every one charged)."""

    @abstractmethod
    def argmax_neighbour_logq(self, logq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bounds (low, high) on log q̃ of the argmax step's union bound for any histogram one changed teacher
        away from one whose union bound is ``logq`` (every gap x becomes at most x ± 2); uncapped."""


@dataclass(frozen=True)
class LNMax(Aggregator):
    """LNMax (Papernot et al. 2017): argmax of counts + Laplace(1/γ) noise.

    Data-independent: two Laplace(1/γ) coordinates change by 1 (two Laplace events per query).
    Data-dependent: q̃ the union bound of 2017 Lemma 4, RDP by 2017 Theorem 3 (:func:`laplace_rdp`).
    """

    spec: LNMaxSpec

    @property
    def gamma(self) -> float:
        """Laplace inverse scale."""
        return self.spec.gamma

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, "gamma")

    def answer(self, histograms: np.ndarray, *, noise: NoiseSource) -> np.ndarray:
        return lnmax(histograms, gamma=self.gamma, noise=noise)

    def argmax_answer(self, histograms: np.ndarray, *, noise: NoiseSource) -> np.ndarray:
        return self.answer(histograms, noise=noise)

    def argmax_logq(self, gaps: np.ndarray) -> np.ndarray:
        return logq_lnmax_from_gaps(gaps, self.gamma, self.classes)

    def argmax_rdp(self, logq: np.ndarray, *, order: float) -> np.ndarray:
        return laplace_rdp(logq, gamma=self.gamma, order=order)

    def data_independent_events(self, *, queries: int, stage: str) -> list[Event]:
        return [LaplaceEvent(stage=stage, noise_multiplier=1.0 / self.gamma, count=2 * queries)]

    def argmax_neighbour_logq(self, logq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # each term (2 + γx)/(4e^{γx}) moves by a factor in [e^{−2γ}, e^{2γ}] when x moves by 2
        logq = np.asarray(logq, dtype=np.float64)
        return logq - 2.0 * self.gamma, logq + 2.0 * self.gamma


@dataclass(frozen=True)
class _GaussianArgmax(Aggregator):
    """An aggregator whose argmax step is GNMax with noise ``argmax_sigma``."""

    @property
    @abstractmethod
    def argmax_sigma(self) -> float:
        """σ of the argmax step's N(0, σ²) on each count."""

    def argmax_logq(self, gaps: np.ndarray) -> np.ndarray:
        return logq_gnmax_from_gaps(gaps, self.argmax_sigma, self.classes)

    def argmax_rdp(self, logq: np.ndarray, *, order: float) -> np.ndarray:
        return gaussian_rdp(logq, sigma=self.argmax_sigma, order=order)

    def _argmax_event(self, *, queries: int, stage: str) -> GaussianEvent:
        # two counts move by one: L2 sensitivity √2, noise multiplier σ/√2
        return GaussianEvent(stage=stage, noise_multiplier=self.argmax_sigma / math.sqrt(2.0), count=queries)

    def argmax_neighbour_logq(self, logq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return gnmax_neighbour_logq(logq, sigma=self.argmax_sigma, classes=self.classes)

    def argmax_answer(self, histograms: np.ndarray, *, noise: NoiseSource) -> np.ndarray:
        return gnmax(histograms, sigma=self.argmax_sigma, noise=noise)

    def gdp_costs(self) -> tuple[float, float] | None:
        # the histogram moves by √2 in L2: the argmax step is (√2/σ)-GDP
        return 0.0, 2.0 / self.argmax_sigma**2


@dataclass(frozen=True)
class GNMax(_GaussianArgmax):
    """GNMax (Papernot et al. 2018): argmax of counts + N(0, σ²) noise.

    Data-independent: a Gaussian of L2 sensitivity √2 per query (noise multiplier σ/√2).
    Data-dependent: q̃ the union bound of 2018 Prop. 7, RDP by 2018 Theorem 6 (:func:`gaussian_rdp`).
    """

    spec: GNMaxSpec

    @property
    def sigma(self) -> float:
        return self.spec.sigma

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, "sigma")

    @property
    def argmax_sigma(self) -> float:
        return float(self.sigma)

    def answer(self, histograms: np.ndarray, *, noise: NoiseSource) -> np.ndarray:
        return gnmax(histograms, sigma=self.sigma, noise=noise)

    def data_independent_events(self, *, queries: int, stage: str) -> list[Event]:
        return [self._argmax_event(queries=queries, stage=stage)]


@dataclass(frozen=True)
class ConfidentGNMax(_GaussianArgmax):
    """Confident-GNMax (Papernot et al. 2018): answer only if max count + N(0, σ₁²) ≥ T, then GNMax with σ₂.

    Data-independent: the threshold's top count has sensitivity 1 (noise multiplier σ₁), plus the
    argmax as GNMax (σ₂). Data-dependent: the threshold's q̃ is min(Pr[answer], Pr[no answer]) from
    the top count (:func:`threshold_rdp`), the argmax's as GNMax's.

    **Both steps are charged on every query asked.** Charging the argmax only on the answered
    queries (as the 2018 paper's tables do) sums a data-dependent selection, an odometer reading
    rather than a bound: with T = 125.5, σ₁ = 50, σ₂ = 0.5 and votes [126, 124] against [125, 125],
    one query's output (label or no answer) has RDP 3.97 at order 2, while only the threshold's
    0.0004 would be charged when it goes unanswered. Running the argmax on every query and
    suppressing its output when the threshold says no is post-processing of a composition whose
    per-query bound no longer depends on the outcome (tests/library/pate/test_pate_analysis.py checks the case
    by exact divergence).
    """

    spec: ConfidentGNMaxSpec

    @property
    def threshold(self) -> float:
        """T."""
        return self.spec.threshold

    @property
    def sigma1(self) -> float:
        """The threshold step's noise."""
        return self.spec.sigma1

    @property
    def sigma2(self) -> float:
        """The argmax step's noise."""
        return self.spec.sigma2

    def __post_init__(self) -> None:
        super().__post_init__()  # (any threshold will do, even one no top count reaches)
        _check_positive(self, "sigma1")
        _check_positive(self, "sigma2")

    @property
    def argmax_sigma(self) -> float:
        return float(self.sigma2)

    def answer(self, histograms: np.ndarray, *, noise: NoiseSource) -> np.ndarray:
        return confident_gnmax(histograms, threshold=self.threshold, sigma1=self.sigma1, sigma2=self.sigma2,
                               noise=noise)

    def passes_threshold(self, histograms: np.ndarray, *, noise: NoiseSource) -> np.ndarray:
        return confident_mask(histograms, threshold=self.threshold, sigma1=self.sigma1, noise=noise)

    def gdp_costs(self) -> tuple[float, float] | None:
        # the top count moves by 1: the threshold step is (1/σ₁)-GDP, charged on every query asked
        return 1.0 / self.sigma1**2, 2.0 / self.sigma2**2

    def threshold_rdp_table(self, *, order: float) -> np.ndarray:
        tops = np.arange(self.teachers + 1, dtype=np.float64)
        log_pr = logpr_answered(tops, threshold=self.threshold, sigma1=self.sigma1)
        return threshold_rdp(log_pr, sigma1=self.sigma1, order=order)

    def data_independent_events(self, *, queries: int, stage: str) -> list[Event]:
        return [GaussianEvent(stage=stage, noise_multiplier=self.sigma1, count=queries),
                self._argmax_event(queries=queries, stage=stage)]
