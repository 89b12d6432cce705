"""Noisy-vote aggregation (LNMax, GNMax, Confident-GNMax) on fixed histograms and seeds."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest
from scipy.stats import norm

from privpipe.config import ConfigError
from privpipe.config.aggregate import AGGREGATORS
from privpipe.pate.aggregate import UNANSWERED, confident_gnmax, gnmax, lnmax
from privpipe.pate.aggregators import Aggregator, make_aggregator
from privpipe.privacy.secure_noise import NoiseSource

#: the names aggregate.mechanism accepts (privpipe.config.aggregate.AGGREGATORS)
MECHANISMS = AGGREGATORS.tags

CLASSES = 10
TEACHERS = 250


def seeded(seed: int = 0) -> NoiseSource:
    return NoiseSource(seed=seed, secure=False)


class Case(NamedTuple):
    """How the tests here build one registered aggregator: its noise parameters (make_aggregator's keywords)
    at a scale, and the function of privpipe.pate.aggregate its ``answer`` must equal."""

    noise: Callable[[str], dict[str, float]]
    function: Callable[..., np.ndarray]


FACTOR = {"normal": 1.0, "small": 0.25, "tiny": 1e-8}

#: one entry per name AGGREGATORS lists, no other (test_the_table_covers_exactly_the_registry): a new
#: aggregator has no case here until one is written for it, and never borrows another's. Each at its usual
#: (paper-sized) noise, with ``scale='small'`` a quarter of it (a wrong or refused answer to a unanimous query
#: then has probability below 1e-20, for unseeded noise), or with ``scale='tiny'`` almost none.
CASES: dict[str, Case] = {
    "lnmax": Case(lambda scale: {"gamma": 0.05 / FACTOR[scale]}, lnmax),
    "gnmax": Case(lambda scale: {"sigma": 40.0 * FACTOR[scale]}, gnmax),
    "confident_gnmax": Case(lambda scale: {"threshold": 0.0 if scale == "tiny" else 150.0,
                                           "sigma1": 30.0 * FACTOR[scale], "sigma2": 40.0 * FACTOR[scale]},
                            confident_gnmax),
}


def run(mechanism: str, histograms: np.ndarray, noise: NoiseSource, scale: str = "normal") -> np.ndarray:
    """The registered aggregator ``mechanism`` (its case's noise at ``scale``) answering ``histograms``."""
    aggregator = make_aggregator(mechanism, TEACHERS, CLASSES, **CASES[mechanism].noise(scale))
    return aggregator.answer(histograms, noise=noise)


def test_the_table_covers_exactly_the_registry():
    assert sorted(CASES) == sorted(MECHANISMS)


def unanimous(queries: int) -> tuple[np.ndarray, np.ndarray]:
    """Every teacher votes for one class, a different one per query."""
    winners = np.arange(queries) % CLASSES
    histograms = np.zeros((queries, CLASSES), dtype=np.int64)
    histograms[np.arange(queries), winners] = TEACHERS
    return histograms, winners


def random_histograms(rng: np.random.Generator, queries: int, classes: int = CLASSES,
                      teachers: int = TEACHERS) -> np.ndarray:
    return np.stack([np.bincount(rng.integers(0, classes, teachers), minlength=classes) for _ in range(queries)])


# -- outputs -----------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_huge_margin_returns_the_plurality(mechanism, seed):
    histograms, winners = unanimous(50)
    labels = run(mechanism, histograms, seeded(seed))
    assert labels.dtype == np.int64 and labels.shape == (50,)
    # Laplace(20) / N(0, 40²) against a 250-vote margin: a wrong label has probability < 1e-5
    np.testing.assert_array_equal(labels, winners)


def test_margin_example_from_the_brief():
    histogram = np.array([[0, 250, 0, 0, 0, 0, 0, 0, 0, 0]])
    for mechanism in MECHANISMS:
        for seed in range(5):
            assert run(mechanism, histogram, seeded(seed)).tolist() == [1]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_tiny_noise_equals_argmax(mechanism):
    rng = np.random.default_rng(7)
    histograms = random_histograms(rng, 200)
    # keep rows whose maximum is unique (np.argmax breaks ties by index, noise at random)
    ordered = np.sort(histograms, axis=1)
    histograms = histograms[ordered[:, -1] > ordered[:, -2]]
    assert len(histograms) > 100
    labels = run(mechanism, histograms, seeded(3), scale="tiny")
    np.testing.assert_array_equal(labels, np.argmax(histograms, axis=1))
    assert (labels != UNANSWERED).all()


def test_confident_gnmax_threshold_above_teachers_answers_nothing():
    histograms, _ = unanimous(30)
    labels = confident_gnmax(histograms, threshold=TEACHERS + 1, sigma1=1e-6, sigma2=40.0, noise=seeded(0))
    assert labels.dtype == np.int64
    assert (labels == UNANSWERED).all() and UNANSWERED == -1


def test_confident_gnmax_threshold_zero_answers_everything():
    rng = np.random.default_rng(11)
    histograms = random_histograms(rng, 40)
    labels = confident_gnmax(histograms, threshold=0.0, sigma1=1e-6, sigma2=40.0, noise=seeded(0))
    assert (labels >= 0).all() and (labels < CLASSES).all()


def test_confident_gnmax_answers_exactly_the_rows_whose_top_count_clears_the_threshold():
    histograms = np.array([[250, 0, 0], [100, 90, 60], [200, 50, 0], [84, 83, 83], [199, 51, 0]])
    labels = confident_gnmax(histograms, threshold=199.5, sigma1=1e-6, sigma2=1e-6, noise=seeded(4))
    assert labels.tolist() == [0, UNANSWERED, 0, UNANSWERED, UNANSWERED]


# -- the exact draws of a seeded NoiseSource -------------------------------------------------


def test_gnmax_uses_normal_noise_of_std_sigma_from_the_seed():
    rng = np.random.default_rng(5)
    histograms = random_histograms(rng, 300)
    sigma = 7.5
    expected = np.argmax(histograms + np.random.default_rng(21).normal(0.0, sigma, histograms.shape), axis=1)
    np.testing.assert_array_equal(gnmax(histograms, sigma=sigma, noise=seeded(21)), expected)


def test_lnmax_uses_laplace_noise_of_scale_one_over_gamma_from_the_seed():
    rng = np.random.default_rng(6)
    histograms = random_histograms(rng, 300)
    gamma = 0.2
    expected = np.argmax(histograms + np.random.default_rng(22).laplace(0.0, 1.0 / gamma, histograms.shape), axis=1)
    np.testing.assert_array_equal(lnmax(histograms, gamma=gamma, noise=seeded(22)), expected)


def test_confident_gnmax_draws_threshold_noise_then_argmax_noise_for_answered_rows():
    rng = np.random.default_rng(8)
    histograms = random_histograms(rng, 300, classes=4, teachers=40)
    threshold, sigma1, sigma2 = 17.0, 3.0, 2.0
    generator = np.random.default_rng(23)
    answered = histograms.max(axis=1) + generator.normal(0.0, sigma1, len(histograms)) >= threshold
    assert 0 < answered.sum() < len(histograms)
    expected = np.full(len(histograms), -1)
    chosen = histograms[answered]
    expected[answered] = np.argmax(chosen + generator.normal(0.0, sigma2, chosen.shape), axis=1)
    labels = confident_gnmax(histograms, threshold=threshold, sigma1=sigma1, sigma2=sigma2, noise=seeded(23))
    np.testing.assert_array_equal(labels, expected)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_reproducible_for_a_seed_and_different_across_seeds(mechanism):
    # ambiguous: 250 teachers split evenly over the first two classes, lightly elsewhere
    histograms = np.tile(np.array([[100, 100, 10, 10, 10, 5, 5, 5, 5, 0]]), (300, 1))
    first = run(mechanism, histograms, seeded(10))
    again = run(mechanism, histograms, seeded(10))
    other = run(mechanism, histograms, seeded(11))
    np.testing.assert_array_equal(first, again)
    assert (first != other).any()
    # both leading classes are actually drawn (noise breaks the tie both ways)
    assert {0, 1} <= set(first.tolist())


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_aggregate_dispatches_to_each_mechanism(mechanism):
    rng = np.random.default_rng(9)
    histograms = random_histograms(rng, 100)
    case = CASES[mechanism]
    for scale in FACTOR:
        np.testing.assert_array_equal(run(mechanism, histograms, seeded(1), scale),
                                      case.function(histograms, **case.noise(scale), noise=seeded(1)))


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_secure_noise_returns_valid_labels(mechanism):
    histograms, winners = unanimous(20)
    # the OS generator cannot be seeded, so the noise is small enough that this never fails by chance
    # (at the usual noise Confident-GNMax refuses a unanimous query with probability 4e-4)
    labels = run(mechanism, histograms, NoiseSource(seed=0, secure=True), scale="small")
    assert labels.dtype == np.int64 and labels.shape == (20,)
    np.testing.assert_array_equal(labels, winners)
    ambiguous = np.tile(np.array([[125, 125, 0, 0, 0, 0, 0, 0, 0, 0]]), (200, 1))
    labels = run(mechanism, ambiguous, NoiseSource(seed=0, secure=True))
    assert labels.dtype == np.int64 and labels.shape == (200,)
    assert ((labels == UNANSWERED) | ((labels >= 0) & (labels < CLASSES))).all()
    # the OS generator is not the seed's: the even split goes both ways
    assert {0, 1} <= set(labels.tolist())


# -- statistics of the noise ---------------------------------------------------------------------


@pytest.mark.parametrize("gap, sigma", [(3, 2.0), (10, 5.0), (0, 4.0)])
def test_gnmax_picks_the_runner_up_with_the_gaussian_probability(gap, sigma):
    draws = 20_000
    histograms = np.tile(np.array([[50 + gap, 50]]), (draws, 1))
    labels = gnmax(histograms, sigma=sigma, noise=seeded(gap))
    # runner-up wins iff N1 − N0 > gap, N1 − N0 ~ N(0, 2σ²)
    expected = norm.cdf(-gap / (math.sqrt(2.0) * sigma))
    standard_error = math.sqrt(expected * (1 - expected) / draws)
    assert abs((labels == 1).mean() - expected) <= 4 * standard_error


@pytest.mark.parametrize("gap, gamma", [(3, 0.5), (8, 0.25)])
def test_lnmax_picks_the_runner_up_with_the_laplace_difference_probability(gap, gamma):
    draws = 20_000
    histograms = np.tile(np.array([[40 + gap, 40]]), (draws, 1))
    labels = lnmax(histograms, gamma=gamma, noise=seeded(gap))
    # L1 − L0 with L_i ~ Laplace(1/γ): Pr[L1 − L0 > g] = (2 + γg)/4 · e^{−γg}
    expected = (2 + gamma * gap) / 4 * math.exp(-gamma * gap)
    standard_error = math.sqrt(expected * (1 - expected) / draws)
    assert abs((labels == 1).mean() - expected) <= 4 * standard_error


def test_confident_gnmax_answers_with_the_threshold_probability():
    draws = 20_000
    histograms = np.tile(np.array([[30, 10]]), (draws, 1))
    threshold, sigma1 = 33.0, 4.0
    labels = confident_gnmax(histograms, threshold=threshold, sigma1=sigma1, sigma2=1.0, noise=seeded(2))
    expected = norm.cdf((30 - threshold) / sigma1)
    standard_error = math.sqrt(expected * (1 - expected) / draws)
    assert abs((labels != UNANSWERED).mean() - expected) <= 4 * standard_error
    assert set(labels.tolist()) <= {UNANSWERED, 0}


# -- bad parameters -------------------------------------------------------------------------


GOOD = np.array([[3, 1, 1], [0, 5, 0]])


@pytest.mark.parametrize("sigma", [0.0, -1.0, float("nan")])
def test_gnmax_rejects_non_positive_sigma(sigma):
    with pytest.raises(ValueError, match="sigma"):
        gnmax(GOOD, sigma=sigma, noise=seeded())


@pytest.mark.parametrize("gamma", [0.0, -0.5, float("nan")])
def test_lnmax_rejects_non_positive_gamma(gamma):
    with pytest.raises(ValueError, match="gamma"):
        lnmax(GOOD, gamma=gamma, noise=seeded())


@pytest.mark.parametrize("field", ["sigma1", "sigma2"])
@pytest.mark.parametrize("value", [0.0, -2.0])
def test_confident_gnmax_rejects_non_positive_sigmas(field, value):
    params = {"threshold": 3.0, "sigma1": 1.0, "sigma2": 1.0, field: value}
    with pytest.raises(ValueError, match=field):
        confident_gnmax(GOOD, noise=seeded(), **params)


@pytest.mark.parametrize("histograms", [
    np.array([3, 1, 1]),  # 1-D
    np.zeros((2, 3, 4)),  # 3-D
    np.array([[5], [5]]),  # one class
    np.zeros((3, 0)),  # no classes
])
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_bad_histogram_shapes_raise(histograms, mechanism):
    with pytest.raises(ValueError, match="histograms"):
        run(mechanism, histograms, seeded())


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_negative_counts_raise(mechanism):
    with pytest.raises(ValueError, match=">= 0"):
        run(mechanism, np.array([[3, -1, 3], [1, 2, 2]]), seeded())


def test_aggregate_rejects_an_unknown_mechanism_or_parameter_and_non_positive_noise():
    with pytest.raises(ConfigError, match=r"^aggregate.mechanism: unknown value 'exponential' \(choose one of "):
        make_aggregator("exponential", 5, 3, sigma=1.0)
    with pytest.raises(ConfigError, match=r"^aggregate.mechanism.gnmax.gamma: unknown key \(gnmax takes sigma\)$"):
        make_aggregator("gnmax", 5, 3, gamma=1.0)
    with pytest.raises(ConfigError, match=r"^aggregate.mechanism.lnmax.gamma: expected a number"):
        make_aggregator({"lnmax": {"gamma": "wide"}}, 5, 3)
    with pytest.raises(ValueError, match="sigma must be > 0"):
        make_aggregator("gnmax", 5, 3, sigma=0.0).answer(GOOD, noise=seeded())
    with pytest.raises(ValueError, match="sigma1 must be > 0 for confident_gnmax"):
        make_aggregator("confident_gnmax", 5, 3, sigma1=0.0)
    with pytest.raises(TypeError, match="keywords go with an aggregator's name"):
        make_aggregator(AGGREGATORS["gnmax"], 5, 3, sigma=1.0)


@pytest.mark.parametrize("spec", list(AGGREGATORS), ids=MECHANISMS)
def test_each_aggregator_spec_names_its_class_and_its_aggregator_answers(spec):
    """Issue 49: a spec (privpipe.config.aggregate) names the class that implements it, built from the spec alone:
    by its tag (the defaults), as {tag: {parameters}}, or as the parsed spec itself."""
    kind = spec.load()
    assert isinstance(kind, type) and issubclass(kind, Aggregator)
    changed = {name: value * 0.5 for name, value in spec.parameters().items()}
    for given, parameters in ((spec, spec.parameters()), (spec.tag, spec.parameters()),
                              ({spec.tag: changed}, changed)):
        aggregator = make_aggregator(given, TEACHERS, CLASSES)
        assert type(aggregator) is kind and aggregator.mechanism == spec.tag
        assert aggregator.spec.parameters() == parameters
        assert aggregator.public() == {"mechanism": spec.tag, "teachers": TEACHERS, "classes": CLASSES, **parameters}
        assert {name: getattr(aggregator, name) for name in parameters} == parameters
    # the spec says whether every step is Gaussian (what a GDP filter needs) without importing the class
    assert spec.gaussian == (aggregator.gdp_costs() is not None)
    histograms, winners = unanimous(30)
    labels = make_aggregator(spec, TEACHERS, CLASSES).answer(histograms, noise=seeded(5))  # at its defaults
    assert labels.shape == (30,) and (labels >= 0).any()
    np.testing.assert_array_equal(labels[labels >= 0], winners[labels >= 0])
