"""aggregate: public queries labelled by the teachers' noisy vote (Papernot et al. 2017, 2018),
and how the data-dependent cost of those answers is released (smooth sensitivity)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.errors import one_of, require
from privpipe.config.privacy import PrivacyConfig
from privpipe.config.ranges import MAX_COUNT, MAX_EPSILON, MAX_SCALE, Range, above, at_least, fraction

#: privpipe.pate.registry's aggregators and each one's noise parameters (the others are ignored). Written out:
#: the registry imports torch, which checking params must not; tests/test_config.py fails if they ever differ
NOISE_KEYS = {"lnmax": ("gamma",), "gnmax": ("sigma",), "confident_gnmax": ("threshold", "sigma1", "sigma2")}
AGGREGATORS = tuple(NOISE_KEYS)
ANALYSES = ("auto", "data_dependent", "data_independent", "filter")
#: the aggregators whose every step is Gaussian, which a GDP filter can hold (privpipe.pate.gdp_filter)
FILTERABLE = ("gnmax", "confident_gnmax")

#: The RDP orders the privacy ledger composes at: dp_accounting's DEFAULT_RDP_ORDERS, as floats, exactly as
#: privpipe.privacy.RDP_ORDERS builds them. Written out so that checking params does not import torch
#: (privpipe.privacy does); tests/test_config.py fails if the two ever differ.
LEDGER_RDP_ORDERS: tuple[float, ...] = tuple(
    float(a) for a in [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024])


@dataclass(frozen=True)
class AggregateConfig:
    #: lnmax (Laplace, gamma) | gnmax (Gaussian, sigma) | confident_gnmax (threshold, sigma1, sigma2)
    mechanism: str = "gnmax"
    #: public records asked (0 = all); every query asked costs privacy, answered or not
    queries: int = 20  # every answer costs privacy, and digits' 50 small teachers answer few of them well
    #: lnmax: Laplace(1/gamma) on each count
    gamma: float | None = None
    #: gnmax: N(0, sigma²) on each count
    sigma: float | None = 40.0  # PATE 2018's answer noise on MNIST (their σ₂)
    #: confident_gnmax: answer only if the noisy top count ≥ threshold …
    threshold: float | None = None
    #: … with N(0, sigma1²) on the top count
    sigma1: float | None = None
    #: … then noisy argmax with N(0, sigma2²)
    sigma2: float | None = None
    #: auto (data-dependent only where its best case beats data-independent, decided before the votes) | data_dependent
    #: | data_independent | filter (gnmax, confident_gnmax: queries asked in order under a fixed GDP budget; an
    #: unanswered query costs only its threshold)
    analysis: str = "auto"  # data-dependent only where its best case can beat data-independent
    #: filter: the aggregation's own ε at privacy.delta, fixed before the votes
    filter_epsilon: float | None = None  # analysis filter: the aggregation's own ε at privacy.delta, fixed up front
    #: the RDP order the data-dependent bound is released at (one of the ledger's orders)
    rdp_order: float = 20.0
    #: β of the smooth sensitivity; must be < 1/(2·rdp_order)
    ss_beta: float = 0.01  # below 1/(2·rdp_order) = 0.025, as the smooth-sensitivity release needs
    #: σ_s: the release adds SS·N(0, σ_s²)
    ss_noise: float = 20.0
    #: chance the released bound undershoots; spent out of privacy.delta
    ss_failure_probability: float = 1e-7  # spent out of privacy.delta: 1 % of the default δ

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {
        "queries": at_least(0, MAX_COUNT), "gamma": above(0, MAX_SCALE), "sigma": above(0, MAX_SCALE),
        "threshold": at_least(-MAX_COUNT, MAX_COUNT), "sigma1": above(0, MAX_SCALE), "sigma2": above(0, MAX_SCALE),
        "filter_epsilon": above(0, MAX_EPSILON), "rdp_order": above(1, 1024), "ss_beta": above(0, 1),
        "ss_noise": above(0, MAX_SCALE), "ss_failure_probability": fraction(),
    }


def check(aggregate: AggregateConfig, *, privacy: PrivacyConfig) -> None:
    one_of(aggregate.mechanism, AGGREGATORS, "aggregate.mechanism")
    for key in NOISE_KEYS[aggregate.mechanism]:
        value = getattr(aggregate, key)
        require(value is not None, f"aggregate.{key}", f"must be set for {aggregate.mechanism}")
        require(key == "threshold" or value > 0, f"aggregate.{key}", "must be > 0")
    require(aggregate.queries >= 0, "aggregate.queries", "must be >= 0 (0 = the whole public pool)")
    one_of(aggregate.analysis, ANALYSES, "aggregate.analysis")
    if aggregate.analysis == "filter":
        require(aggregate.mechanism in FILTERABLE, "aggregate.analysis",
                f"filter needs Gaussian noise on every step ({' or '.join(FILTERABLE)}), not {aggregate.mechanism}")
        require(aggregate.filter_epsilon is not None, "aggregate.filter_epsilon",
                "must be set for aggregate.analysis: filter (the aggregation's ε at privacy.delta)")
    require(aggregate.rdp_order in LEDGER_RDP_ORDERS, "aggregate.rdp_order",
            f"must be one of the ledger's RDP orders ({', '.join(f'{a:g}' for a in LEDGER_RDP_ORDERS)})")
    beta_bound = 1 / (2 * aggregate.rdp_order)
    require(0 < aggregate.ss_beta < beta_bound, "aggregate.ss_beta",
            f"must be in (0, 1/(2·rdp_order)) = (0, {beta_bound:.4g}) for the smooth-sensitivity release")
    require(aggregate.ss_noise > 0, "aggregate.ss_noise", "must be > 0")
    require(0 < aggregate.ss_failure_probability < privacy.delta, "aggregate.ss_failure_probability",
            f"must be in (0, privacy.delta = {privacy.delta:g}): it is spent out of the run's δ")
