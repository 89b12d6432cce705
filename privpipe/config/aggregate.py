"""aggregate: public queries labelled by the teachers' noisy vote (Papernot et al. 2017, 2018),
and how the data-dependent cost of those answers is released (smooth sensitivity).

Two pluggable choices (privpipe.config.choices), each listed once below:

- ``aggregate.mechanism``, :data:`AGGREGATORS`: the noisy vote, a spec whose parameters are its noise,
  naming its class in privpipe.pate.aggregators. params.yaml writes ``mechanism: gnmax`` (its defaults)
  or ``mechanism: {gnmax: {sigma: 40.0}}``.
- ``aggregate.analysis``, :data:`ANALYSES`: how the answers are accounted for, each mode naming its class
  in privpipe.pate.analysis_modes (``analysis: auto``, ``analysis: {filter: {epsilon: 1.0}}``).

Adding an aggregator is its spec here (its noise parameters, their defaults and ranges), its class in
privpipe/pate/aggregators.py and its line in AGGREGATORS; adding an analysis mode is its class in
privpipe/pate/analysis_modes.py and its line in ANALYSES (and a spec here if it has parameters).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from privpipe.config.choices import Choice, Variant, fixed
from privpipe.config.errors import require
from privpipe.config.privacy import RDP_ORDERS, PrivacyConfig
from privpipe.config.ranges import MAX_COUNT, MAX_EPSILON, MAX_SCALE, Range, above, at_least, check_ranges, fraction

__all__ = ["AggregateConfig", "AggregatorSpec", "LNMaxSpec", "GNMaxSpec", "ConfidentGNMaxSpec", "AGGREGATORS",
           "AnalysisSpec", "FilterSpec", "ANALYSES", "check"]


@dataclass(frozen=True, kw_only=True)
class _CheckedVariant(Variant):
    """A variant whose parameters each have a range (privpipe.config.ranges), beside the field."""

    #: each parameter's range, checked with the section (a None value is not checked: see :meth:`check`)
    RANGES: ClassVar[dict[str, Range]] = {}

    def check(self, key: str) -> None:
        """ConfigError naming ``key.tag.parameter`` for the first parameter outside its range."""
        check_ranges(f"{key}.{self.tag}", self)


# -- aggregate.mechanism ------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class AggregatorSpec(_CheckedVariant):
    """An aggregator of privpipe.pate.aggregators, its parameters its noise (``spec.load()(teachers, classes,
    spec)`` builds it: privpipe.pate.aggregators.make_aggregator)."""

    #: every step's noise is Gaussian, so that a GDP filter can hold it (aggregate.analysis: filter)
    gaussian: bool = fixed(True)


@dataclass(frozen=True, kw_only=True)
class LNMaxSpec(AggregatorSpec):
    """LNMax (Papernot et al. 2017): Laplace(1/gamma) on each count."""

    #: Laplace(1/gamma) on each count
    gamma: float = 0.05  # PATE 2017's MNIST setting
    RANGES: ClassVar[dict[str, Range]] = {"gamma": above(0, MAX_SCALE)}


@dataclass(frozen=True, kw_only=True)
class GNMaxSpec(AggregatorSpec):
    """GNMax (Papernot et al. 2018): N(0, sigma²) on each count."""

    #: N(0, sigma²) on each count
    sigma: float = 40.0  # PATE 2018's answer noise on MNIST (their σ₂)
    RANGES: ClassVar[dict[str, Range]] = {"sigma": above(0, MAX_SCALE)}


@dataclass(frozen=True, kw_only=True)
class ConfidentGNMaxSpec(AggregatorSpec):
    """Confident-GNMax (Papernot et al. 2018): answer only if the top count + N(0, sigma1²) ≥ threshold, then
    the noisy argmax with N(0, sigma2²)."""

    #: answer only if the noisy top count ≥ threshold (a vote count: scale it to partition.shards) …
    threshold: float = 200.0  # PATE 2018's MNIST setting, for 250 teachers
    #: … with N(0, sigma1²) on the top count
    sigma1: float = 150.0
    #: … then the noisy argmax with N(0, sigma2²)
    sigma2: float = 40.0
    RANGES: ClassVar[dict[str, Range]] = {"threshold": at_least(-MAX_COUNT, MAX_COUNT),
                                          "sigma1": above(0, MAX_SCALE), "sigma2": above(0, MAX_SCALE)}


#: aggregate.mechanism: the noisy votes (privpipe.pate.aggregators)
AGGREGATORS: Choice[AggregatorSpec] = Choice("aggregate.mechanism", [
    LNMaxSpec(tag="lnmax", implementation="privpipe.pate.aggregators:LNMax", gaussian=False),
    GNMaxSpec(tag="gnmax", implementation="privpipe.pate.aggregators:GNMax"),
    ConfidentGNMaxSpec(tag="confident_gnmax", implementation="privpipe.pate.aggregators:ConfidentGNMax"),
])


# -- aggregate.analysis -------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class AnalysisSpec(_CheckedVariant):
    """A way of accounting for the answers (privpipe.pate.analysis_modes)."""

    #: it holds only aggregators whose every step is Gaussian (AggregatorSpec.gaussian)
    needs_gaussian: bool = fixed(False)


@dataclass(frozen=True, kw_only=True)
class FilterSpec(AnalysisSpec):
    """The queries asked in order under a GDP budget fixed before the votes (privpipe.pate.gdp_filter)."""

    #: the aggregation's own ε at privacy.delta, fixed before the votes
    epsilon: float | None = None  # no default: a budget is chosen, not assumed
    RANGES: ClassVar[dict[str, Range]] = {"epsilon": above(0, MAX_EPSILON)}

    def check(self, key: str) -> None:
        require(self.epsilon is not None, f"{key}.{self.tag}.epsilon",
                f"must be set: the aggregation's ε at privacy.delta ({key.rpartition('.')[2]}: "
                f"{{{self.tag}: {{epsilon: 1.0}}}})")
        super().check(key)


#: aggregate.analysis: how the answers are accounted for (privpipe.pate.analysis_modes)
ANALYSES: Choice[AnalysisSpec] = Choice("aggregate.analysis", [
    AnalysisSpec(tag="auto", implementation="privpipe.pate.analysis_modes:Auto"),
    AnalysisSpec(tag="data_dependent", implementation="privpipe.pate.analysis_modes:DataDependent"),
    AnalysisSpec(tag="data_independent", implementation="privpipe.pate.analysis_modes:DataIndependent"),
    FilterSpec(tag="filter", implementation="privpipe.pate.analysis_modes:Filter", needs_gaussian=True),
])


@dataclass(frozen=True)
class AggregateConfig:
    #: lnmax (Laplace: gamma) | gnmax (Gaussian: sigma) | confident_gnmax (threshold, sigma1, sigma2), each by
    #: its name alone (its defaults) or with its parameters: {gnmax: {sigma: 40.0}}
    mechanism: AggregatorSpec = field(default=AGGREGATORS["gnmax"], metadata={"choice": AGGREGATORS})
    #: public records asked (0 = all); every query asked costs privacy, answered or not
    queries: int = 20  # every answer costs privacy, and digits' 50 small teachers answer few of them well
    #: auto (data-dependent only where its best case beats data-independent, decided before the votes) | data_dependent
    #: | data_independent | {filter: {epsilon: ε}} (gnmax, confident_gnmax: queries asked in order under a GDP budget
    #: of ε at privacy.delta, fixed before the votes; an unanswered query costs only its threshold)
    analysis: AnalysisSpec = field(default=ANALYSES["auto"], metadata={"choice": ANALYSES})
    #: the RDP order the data-dependent bound is released at (one of the ledger's orders)
    rdp_order: float = 20.0
    #: β of the smooth sensitivity; must be < 1/(2·rdp_order)
    ss_beta: float = 0.01  # below 1/(2·rdp_order) = 0.025, as the smooth-sensitivity release needs
    #: σ_s: the release adds SS·N(0, σ_s²)
    ss_noise: float = 20.0
    #: chance the released bound undershoots; spent out of privacy.delta
    ss_failure_probability: float = 1e-7  # spent out of privacy.delta: 1 % of the default δ

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks; the
    #: mechanism's and the analysis's parameters have theirs on their specs
    RANGES: ClassVar[dict[str, Range]] = {
        "queries": at_least(0, MAX_COUNT), "rdp_order": above(1, 1024), "ss_beta": above(0, 1),
        "ss_noise": above(0, MAX_SCALE), "ss_failure_probability": fraction(),
    }


def check(aggregate: AggregateConfig, *, privacy: PrivacyConfig) -> None:
    aggregate.mechanism.check("aggregate.mechanism")
    require(aggregate.queries >= 0, "aggregate.queries", "must be >= 0 (0 = the whole public pool)")
    gaussian = [spec.tag for spec in AGGREGATORS if spec.gaussian]
    require(aggregate.mechanism.gaussian or not aggregate.analysis.needs_gaussian, "aggregate.analysis",
            f"{aggregate.analysis.tag} needs Gaussian noise on every step ({' or '.join(gaussian)}), "
            f"not {aggregate.mechanism.tag}")
    aggregate.analysis.check("aggregate.analysis")
    require(aggregate.rdp_order in RDP_ORDERS, "aggregate.rdp_order",
            f"must be one of the ledger's RDP orders ({', '.join(f'{a:g}' for a in RDP_ORDERS)})")
    beta_bound = 1 / (2 * aggregate.rdp_order)
    require(0 < aggregate.ss_beta < beta_bound, "aggregate.ss_beta",
            f"must be in (0, 1/(2·rdp_order)) = (0, {beta_bound:.4g}) for the smooth-sensitivity release")
    require(aggregate.ss_noise > 0, "aggregate.ss_noise", "must be > 0")
    require(0 < aggregate.ss_failure_probability < privacy.delta, "aggregate.ss_failure_probability",
            f"must be in (0, privacy.delta = {privacy.delta:g}): it is spent out of the run's δ")
