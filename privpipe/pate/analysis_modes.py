"""How the aggregate stage accounts for PATE's answers: one class per ``aggregate.analysis`` mode.

    mode = analysis_mode(params.aggregate.analysis)            # the spec params.yaml names: its class here
    mode.check(params.aggregate.mechanism, teachers=250, classes=10, delta=1e-5)   # before any work
    analysis = mode.decide(Setting(aggregator, queries=640, ledger=ledger, config=params.aggregate,
                                   accountant=ACCOUNTANTS[params.privacy.accountant]))   # public: no votes
    ledger.ensure_affordable(*analysis.planned())
    answers = analysis.answer(histograms, noise=noise, release_noise=release_noise)
    ledger.record(*answers.recorded)

A mode (:class:`AnalysisMode`) decides, before any vote is seen and from public information only, which
:class:`Analysis` the run records: ``auto`` the data-dependent one only where its best case can win
(privpipe.pate.analysis.choose_analysis), ``data_dependent`` and ``data_independent`` that one by name,
``filter`` the GDP filter (privpipe.pate.gdp_filter). An analysis says what the ledger is planned to record
(checked against the budget before any noise is drawn), answers the queries and says what the ledger records
for them, with the public figures and the private values (the raw data-dependent bound) the stage writes.

The modes are listed by privpipe.config.aggregate.ANALYSES, each line naming its class here (checking params
imports none of this). Adding one is its class below and its line there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from privpipe.config.aggregate import ANALYSES, AggregateConfig, AggregatorSpec, AnalysisSpec, FilterSpec
from privpipe.config.errors import ConfigError
from privpipe.config.privacy import ACCOUNTANTS, AccountantVariant
from privpipe.pate.aggregators import Aggregator, make_aggregator
from privpipe.pate.analysis import (
    AnalysisChoice,
    SanitisedRelease,
    choose_analysis,
    data_dependent_rdp,
    data_independent_events,
    planned_release_event,
    sanitise,
)
from privpipe.pate.gdp_filter import answer_within_budget, filter_event, gdp_costs, gdp_mu_for_epsilon, recorded_mu
from privpipe.privacy.composition import RDP_ORDERS
from privpipe.privacy.events import Event
from privpipe.privacy.ledger import Ledger, compute_epsilon
from privpipe.privacy.secure_noise import NoiseSource

__all__ = ["Setting", "Answers", "Analysis", "DataIndependentAnalysis", "DataDependentAnalysis", "FilterAnalysis",
           "AnalysisMode", "Auto", "DataDependent", "DataIndependent", "Filter", "analysis_mode", "epsilon_alone"]


def epsilon_alone(events: Sequence[Event], ledger: Ledger) -> float:
    """The ε of ``events`` alone, at the ledger's δ and by its accountant (0 for none)."""
    return compute_epsilon(events, delta=ledger.delta, accountant=ledger.accountant).epsilon if events else 0.0


@dataclass(frozen=True)
class Setting:
    """What an analysis is decided from, all of it public: the aggregator, the queries asked, the run's
    ledger so far, the stage's settings (the sanitised release's) and the run's accountant."""

    aggregator: Aggregator
    queries: int
    ledger: Ledger
    config: AggregateConfig
    accountant: AccountantVariant

    def release_settings(self) -> dict[str, float]:
        """The sanitised data-dependent release's settings, as privpipe.pate.analysis takes them."""
        return {"order": self.config.rdp_order, "beta": self.config.ss_beta, "noise_scale": self.config.ss_noise,
                "failure_probability": self.config.ss_failure_probability}

    def choose(self) -> AnalysisChoice:
        """Whether the data-dependent analysis can win, measured in the run's ε after the ledger's events (by an
        accountant that composes RDP curves)."""
        return choose_analysis(self.aggregator, queries=self.queries, **self.release_settings(),
                               epsilon_of=lambda events: self.ledger.epsilon(events).epsilon)

    def data_independent_epsilon(self) -> float:
        """The run's ε after the ledger's events and the data-independent events of the queries."""
        return self.ledger.epsilon(data_independent_events(self.aggregator, queries=self.queries)).epsilon


@dataclass(frozen=True)
class Answers:
    """The queries answered, and what the ledger records for them."""

    labels: np.ndarray  # −1: unanswered (or never asked)
    asked: int  # each one charged (under the filter, its argmax only when answered)
    recorded: tuple[Event, ...]  # what the ledger records
    data_independent: tuple[Event, ...]  # the data-independent events of the queries asked, for comparison
    release: SanitisedRelease | None = None  # the sanitised data-dependent release, where it is recorded
    filter: dict[str, float] | None = None  # the filter's public figures, where one held the queries
    private: dict[str, Any] | None = None  # data-dependent values: written under private/, never published
    notes: tuple[str, ...] = ()  # for the stage's log


class Analysis(ABC):
    """A decided analysis: what the ledger is planned to record, and how the queries are answered and charged."""

    #: the noise it draws, as the stage's warning names it when it comes from a seeded generator
    noise_drawn: ClassVar[str] = "the vote noise comes"

    def __init__(self, setting: Setting, choice: AnalysisChoice) -> None:
        self.setting = setting
        self.choice = choice

    @property
    def aggregator(self) -> Aggregator:
        return self.setting.aggregator

    @abstractmethod
    def planned(self) -> list[Event]:
        """The most the ledger will record: what the budget is checked against before any noise is drawn."""

    @abstractmethod
    def answer(self, histograms: np.ndarray, *, noise: NoiseSource, release_noise: NoiseSource) -> Answers:
        """The labels of the queries' vote histograms (the vote noise from ``noise``, a data-dependent
        release's from ``release_noise``) and what the ledger records for them."""


class DataIndependentAnalysis(Analysis):
    """Every query asked charged the aggregator's own events, answered or not."""

    def planned(self) -> list[Event]:
        return data_independent_events(self.aggregator, queries=self.setting.queries)

    def answer(self, histograms: np.ndarray, *, noise: NoiseSource, release_noise: NoiseSource) -> Answers:
        labels = self.aggregator.answer(histograms, noise=noise)
        independent = tuple(data_independent_events(self.aggregator, queries=len(histograms)))
        return Answers(labels=labels, asked=len(histograms), recorded=independent, data_independent=independent)


class DataDependentAnalysis(Analysis):
    """The data-dependent bound of the votes, released through the smooth-sensitivity Gaussian mechanism."""

    noise_drawn = "the vote noise and the smooth-sensitivity release's noise come"

    def planned(self) -> list[Event]:
        cfg = self.setting.config
        return [planned_release_event(self.aggregator, queries=self.setting.queries, order=cfg.rdp_order,
                                      beta=cfg.ss_beta, noise_scale=cfg.ss_noise,
                                      failure_probability=cfg.ss_failure_probability)]

    def answer(self, histograms: np.ndarray, *, noise: NoiseSource, release_noise: NoiseSource) -> Answers:
        labels = self.aggregator.answer(histograms, noise=noise)
        independent = tuple(data_independent_events(self.aggregator, queries=len(histograms)))
        # computing it publishes it, so only when the ledger pays for it
        raw_curve = data_dependent_rdp(self.aggregator, histograms, orders=RDP_ORDERS)
        delta = self.setting.ledger.delta
        raw_epsilon, raw_order = rdp_privacy_accountant.compute_epsilon(RDP_ORDERS, raw_curve, delta)
        release = sanitise(self.aggregator, histograms, **self.setting.release_settings(), noise=release_noise)
        private = {"warning": "data-dependent values: do not publish", "orders": list(RDP_ORDERS),
                   "rdp": raw_curve.tolist(), "epsilon": float(raw_epsilon), "order": float(raw_order),
                   "rdp_at_release_order": release.raw, "smooth_sensitivity": release.smooth_sensitivity}
        return Answers(labels=labels, asked=len(histograms), recorded=(release.event(),),
                       data_independent=independent, release=release, private=private)


class FilterAnalysis(Analysis):
    """The queries asked in order under a GDP budget ``budget_mu`` fixed up front; the ledger records the budget
    (or every query of the pool at its worst, if less), not what the run happened to spend."""

    def __init__(self, setting: Setting, choice: AnalysisChoice, *, budget_mu: float) -> None:
        super().__init__(setting, choice)
        self.budget_mu = budget_mu

    def planned(self) -> list[Event]:
        return [filter_event(self.aggregator, budget_mu=self.budget_mu, pool=self.setting.queries)]

    def answer(self, histograms: np.ndarray, *, noise: NoiseSource, release_noise: NoiseSource) -> Answers:
        pool = len(histograms)
        filtered = answer_within_budget(self.aggregator, histograms, budget_mu=self.budget_mu, noise=noise)
        figures = {"pool": pool, "asked": filtered.asked, "budget_mu": filtered.budget_mu,
                   "recorded_mu": recorded_mu(self.aggregator, budget_mu=filtered.budget_mu, pool=pool),
                   "spent_mu": filtered.spent_mu}
        notes = (f"the filter's budget stopped the queries after {filtered.asked} of {pool}",) \
            if filtered.asked < pool else ()
        return Answers(labels=filtered.labels, asked=filtered.asked, recorded=tuple(self.planned()),
                       data_independent=tuple(data_independent_events(self.aggregator, queries=filtered.asked)),
                       filter=figures, notes=notes)


# -- the modes: aggregate.analysis -----------------------------------------------------------------------------

class AnalysisMode(ABC):
    """One ``aggregate.analysis`` mode: decides the analysis before any vote is seen."""

    def __init__(self, spec: AnalysisSpec) -> None:
        self.spec = spec

    def check(self, mechanism: AggregatorSpec, *, teachers: int, classes: int, delta: float) -> None:  # noqa: B027
        """Refuse, before any work, what this mode cannot run with these settings (a ConfigError naming the key).
        A hook: most modes have nothing to check."""

    @abstractmethod
    def decide(self, setting: Setting) -> Analysis:
        """The analysis to record, from the settings, the query count and the ledger so far: no votes."""


def _data_independent(setting: Setting, reason: str) -> DataIndependentAnalysis:
    """The data-independent analysis, with what the data-dependent one's best case would have cost where the
    accountant can measure it (an RDP curve has no PLD)."""
    if setting.accountant.accounts_rdp_curves:
        choice = setting.choose()
        best, independent = choice.best_case_epsilon, choice.data_independent_epsilon
    else:
        best, independent = None, setting.data_independent_epsilon()
    return DataIndependentAnalysis(setting, AnalysisChoice("data_independent", reason, best, independent))


class Auto(AnalysisMode):
    """Data-dependent only where its best case beats the data-independent events (and the accountant can
    compose its RDP curve), decided before the votes."""

    def decide(self, setting: Setting) -> Analysis:
        if not setting.accountant.accounts_rdp_curves:
            return _data_independent(setting, f"privacy.accountant is {setting.accountant.tag}")
        choice = setting.choose()
        if choice.analysis == "data_dependent":
            return DataDependentAnalysis(setting, choice)
        return DataIndependentAnalysis(setting, choice)


class DataDependent(AnalysisMode):
    """The sanitised data-dependent release, refused (before any noise is drawn) where it cannot win: its
    release cost would be wasted."""

    def decide(self, setting: Setting) -> Analysis:
        if not setting.accountant.accounts_rdp_curves:  # (config/use.py refuses it first, where stages run)
            able = " or ".join(v.tag for v in ACCOUNTANTS if v.accounts_rdp_curves)
            raise ConfigError(f"privacy.accountant: {setting.accountant.tag} cannot account for "
                              f"{ANALYSES.key}: {self.spec.tag}: an RDP curve has no PLD (use {able})")
        choice = setting.choose()
        if choice.analysis != "data_dependent":
            raise ConfigError(f"{ANALYSES.key}: {self.spec.tag} cannot win here ({choice.reason}); "
                              "use auto or data_independent")
        return DataDependentAnalysis(setting, choice)


class DataIndependent(AnalysisMode):
    """The aggregator's own events on every query asked."""

    def decide(self, setting: Setting) -> Analysis:
        return _data_independent(setting, f"set by {ANALYSES.key}")


class Filter(AnalysisMode):
    """A GDP filter of the spec's ε at the run's δ (Gaussian aggregators only: FilterSpec.needs_gaussian)."""

    def __init__(self, spec: AnalysisSpec) -> None:
        if not isinstance(spec, FilterSpec):
            raise TypeError(f"{type(self).__name__} needs a FilterSpec, got {type(spec).__name__}")
        super().__init__(spec)
        self.key = f"{ANALYSES.key}.{spec.tag}.epsilon"
        if spec.epsilon is None:  # (config refuses it first)
            raise ConfigError(f"{self.key}: must be set (the aggregation's ε at privacy.delta)")
        self.epsilon: float = spec.epsilon

    def budget_mu(self, delta: float) -> float:
        """μ of the budget whose (ε, δ) is the spec's ε at ``delta``."""
        return gdp_mu_for_epsilon(self.epsilon, delta=delta)

    def check(self, mechanism: AggregatorSpec, *, teachers: int, classes: int, delta: float) -> None:
        self._holds_a_query(make_aggregator(mechanism, teachers, classes), delta)

    def _holds_a_query(self, aggregator: Aggregator, delta: float) -> None:
        """A filter whose budget holds not even one query at its worst would ask nothing: refused up front."""
        ask, answer = gdp_costs(aggregator)
        budget = self.budget_mu(delta)
        if budget**2 < ask + answer:
            raise ConfigError(f"{self.key}: {self.epsilon:g} holds no query (one query at its worst is "
                              f"μ = {(ask + answer) ** 0.5:.4g}-GDP, the budget μ = {budget:.4g}); "
                              "raise it or the noise")

    def decide(self, setting: Setting) -> Analysis:
        ledger, aggregator = setting.ledger, setting.aggregator
        self._holds_a_query(aggregator, ledger.delta)
        budget = self.budget_mu(ledger.delta)
        alone = epsilon_alone([filter_event(aggregator, budget_mu=budget, pool=setting.queries)], ledger)
        choice = AnalysisChoice("filter", f"set by {ANALYSES.key}: a GDP filter of ε {alone:.4g} at δ "
                                f"{ledger.delta:g}, the threshold charged on every query asked, the argmax on the "
                                "answered ones", alone, setting.data_independent_epsilon())
        return FilterAnalysis(setting, choice, budget_mu=budget)


def analysis_mode(spec: AnalysisSpec) -> AnalysisMode:
    """The mode ``aggregate.analysis`` names (privpipe.config.aggregate.ANALYSES)."""
    mode: AnalysisMode = spec.load()(spec)
    return mode
