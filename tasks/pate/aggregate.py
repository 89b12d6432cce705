"""aggregate: label the public queries by noisy teacher vote, and account for it.

    privpipe stage aggregate        # what dvc repro runs

Decides the analysis first, from public information only (``aggregate.analysis: auto``):
data-dependent accounting is used only if its best case (the expected sanitised release when
every query's votes are alike, at the best top count, plus the release's own cost) beats the
data-independent events in the run's ε; a forced
``data_dependent`` that cannot win is refused before any noise is drawn. Then checks the
worst case against the budget, aggregates (``aggregate.mechanism``) and records either the
data-independent events or the sanitised data-dependent release. Every query asked is
charged, answered or not: which ones were answered depends on the votes. ``aggregate.analysis:
filter`` instead asks the queries in order under a GDP budget fixed by ``filter_epsilon``
(privpipe.pate.gdp_filter): the threshold is charged on every query asked, the argmax only on the
answered ones, and the queries stop when the next one might not fit; the budget is what the
ledger records. The raw
data-dependent bound is private: written only to artifacts/<dataset>/private/, never to MLflow,
metrics or a DVC output.
Output: artifacts/<dataset>/aggregate/{labels.npy (−1 = unanswered), query_ids.npy, analysis.json,
ledger.json}; artifacts/<dataset>/private/aggregate_data_dependent.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.data import UNLABELED, DataError
from privpipe.pate.aggregators import Aggregator
from privpipe.pate.analysis import (
    AnalysisChoice,
    choose_analysis,
    data_dependent_rdp,
    data_independent_events,
    planned_release_event,
    sanitise,
)
from privpipe.pate.gdp_filter import answer_within_budget, filter_event, gdp_costs, gdp_mu_for_epsilon, recorded_mu
from privpipe.pate.registry import aggregator_type, make_aggregator
from privpipe.pate.teachers import vote_histograms
from privpipe.privacy import RDP_ORDERS, Event, Ledger, NoiseSource, compute_epsilon
from tasks import paths
from tasks.common import (
    Skipped,
    read_json,
    seed_for,
    skip_stage,
    stage_logger,
    staged_dir,
    use_torch_threads,
    warn_insecure_rng,
    write_json,
    write_text,
)
from tasks.identity import check_inputs
from tasks.pate.teachers import query_records
from tasks.paths import DatasetPaths
from tasks.prepared import read_shape
from tasks.privacy.ledger import load_ledger
from tasks.projection import check_projection

if TYPE_CHECKING:  # types only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.pate.teachers import Votes
    from tasks.prepared import PreparedSets
    from tasks.projection import Projection
    from tasks.tracking import TrackedRun

__all__ = ["Labels", "run_aggregate", "aggregate_task", "aggregator_spec", "decide_analysis", "filter_budget",
           "check_filter_budget"]


def aggregator_spec(params: Params, *, teachers: int, classes: int) -> Aggregator:
    """``aggregate.mechanism`` from the registry, with its own noise keys of the section (the others are unused)."""
    cfg = params.aggregate
    noise = {key: getattr(cfg, key) for key in aggregator_type(cfg.mechanism).noise_keys()}
    return make_aggregator(cfg.mechanism, teachers, classes, **noise)


def filter_budget(params: Params) -> float:
    """μ of ``aggregate.analysis: filter``: the GDP budget whose (ε, δ) is ``filter_epsilon`` at privacy.delta."""
    epsilon = params.aggregate.filter_epsilon
    if epsilon is None:
        raise ConfigError("aggregate.filter_epsilon: must be set for aggregate.analysis: filter")
    return gdp_mu_for_epsilon(epsilon, delta=params.privacy.delta)


def check_filter_budget(params: Params, *, classes: int) -> None:
    """A filter whose budget holds not even one query at its worst would ask nothing: refused up front."""
    if not (params.student.enabled and params.aggregate.analysis == "filter"):
        return
    ask, answer = gdp_costs(aggregator_spec(params, teachers=params.partition.shards, classes=classes))
    budget = filter_budget(params)
    if budget**2 < ask + answer:
        raise ConfigError(f"aggregate.filter_epsilon: {params.aggregate.filter_epsilon:g} holds no query (one "
                          f"query at its worst is μ = {(ask + answer) ** 0.5:.4g}-GDP, the budget μ = {budget:.4g}); "
                          "raise it or the noise")


def _planned(params: Params, spec: Aggregator, queries: int, analysis: str) -> list[Event]:
    cfg = params.aggregate
    if analysis == "data_independent":
        return data_independent_events(spec, queries=queries)
    if analysis == "filter":
        return [filter_event(spec, budget_mu=filter_budget(params), pool=queries)]
    return [planned_release_event(spec, queries=queries, order=cfg.rdp_order, beta=cfg.ss_beta,
                                  noise_scale=cfg.ss_noise, failure_probability=cfg.ss_failure_probability)]


def _alone(events: list[Event], ledger: Ledger) -> float:
    return compute_epsilon(events, delta=ledger.delta, accountant=ledger.accountant).epsilon if events else 0.0


def decide_analysis(params: Params, spec: Aggregator, queries: int, ledger: Ledger) -> AnalysisChoice:
    """The analysis to record, from the settings, the query count and the ledger so far (no votes).
    A forced ``data_dependent`` that cannot win is a ConfigError: its release cost would be wasted."""
    cfg = params.aggregate
    choice = choose_analysis(spec, queries=queries, order=cfg.rdp_order, beta=cfg.ss_beta, noise_scale=cfg.ss_noise,
                             failure_probability=cfg.ss_failure_probability,
                             epsilon_of=lambda events: ledger.epsilon(events).epsilon)
    if cfg.analysis == "filter":
        check_filter_budget(params, classes=spec.classes)
        alone = _alone(_planned(params, spec, queries, "filter"), ledger)
        return AnalysisChoice("filter", f"set by aggregate.analysis: a GDP filter of ε {alone:.4g} at δ "
                              f"{ledger.delta:g}, the threshold charged on every query asked, the argmax on the "
                              "answered ones", alone, choice.data_independent_epsilon)
    if cfg.analysis == "data_independent" or params.privacy.accountant == "pld":
        # under pld an RDP curve cannot be composed; config refuses a forced data_dependent there
        why = "set by aggregate.analysis" if cfg.analysis == "data_independent" else "privacy.accountant is pld"
        return AnalysisChoice("data_independent", why, choice.best_case_epsilon, choice.data_independent_epsilon)
    if cfg.analysis == "data_dependent" and choice.analysis != "data_dependent":
        raise ConfigError(f"aggregate.analysis: data_dependent cannot win here ({choice.reason}); "
                          "use auto or data_independent")
    return choice


@dataclass(frozen=True)
class Labels:
    """The aggregate stage's output: the noisy labels of the public queries (−1: unanswered) under ``dir``, the
    run's ledger so far, and the stage's public figures."""

    dir: Path
    queries: int  # asked (each one charged; under the filter, its argmax only when answered)
    answered: int
    teachers: int
    label_accuracy: float | None  # against the public pool's own labels, on the answered queries (None: unlabeled)
    analysis: str  # data_dependent | data_independent, decided before the votes were seen
    analysis_reason: str
    epsilon: float  # the stage's ε alone, as recorded
    epsilon_data_independent: float
    epsilon_sanitised: float | None = None  # the sanitised data-dependent release's ε, when it was recorded

    @property
    def ledger_file(self) -> Path:
        return self.dir / "ledger.json"

    def metrics(self) -> dict[str, int | float | str]:
        """metrics/aggregate.json."""
        out: dict[str, int | float | str] = {"queries": self.queries, "answered": self.answered,
                                             "teachers": self.teachers}
        if self.label_accuracy is not None:
            out["label_accuracy"] = self.label_accuracy
        out.update({"analysis": self.analysis, "analysis_reason": self.analysis_reason, "epsilon": self.epsilon,
                    "epsilon_data_independent": self.epsilon_data_independent})
        if self.epsilon_sanitised is not None:
            out["epsilon_sanitised"] = self.epsilon_sanitised
        return out

    @classmethod
    def read(cls, where: DatasetPaths) -> Labels:
        """The last aggregate's output, from its metrics file (what ``privpipe stage evaluate --track``
        records)."""
        figures = read_json(where.metrics_file("aggregate"))
        return cls(dir=where.aggregate, **{"label_accuracy": None, **figures})

    def log(self, run: TrackedRun) -> None:
        """MLflow: the figures, and the run's privacy so far."""
        run.log_stage_figures("aggregate", self.metrics())
        run.log_privacy(Ledger.from_json(self.ledger_file.read_text()))


def _label_accuracy(labels: np.ndarray, truth: np.ndarray, answered: np.ndarray) -> float | None:
    """How many answered queries got the public pool's own label (where the pool has labels: a share of the
    data set does, a pool the user names does not); 0 when none was answered, None when nothing is known."""
    known = answered & (truth != UNLABELED)
    if not (truth != UNLABELED).any():
        return None
    return float((labels[known] == truth[known]).mean()) if known.any() else 0.0


def run_aggregate(params: Params, *, where: DatasetPaths | None = None) -> Labels | Skipped:
    where = where or paths.for_params(params)
    teachers_dir, public, dp_pca_dir, out = where.teachers, where.public, where.dp_pca, where.aggregate
    if not params.student.enabled:
        return skip_stage("aggregate", out, "student.enabled is false", metrics_file=where.metrics_file("aggregate"),
                          made_from=check_inputs(params, where.prepared, teachers_dir))
    made_from = check_inputs(params, where.prepared, teachers_dir, dp_pca_dir)
    log = stage_logger("aggregate")
    use_torch_threads(params, "aggregate")
    cfg = params.aggregate
    ledger = load_ledger(dp_pca_dir / "ledger.json", params)
    check_projection(read_json(teachers_dir / "summary.json")["dp_pca_digest"], dp_pca_dir,
                     source=teachers_dir, rerun="teachers")
    votes = np.load(teachers_dir / "votes.npy")
    queries = query_records(params, public)
    if not np.array_equal(np.load(teachers_dir / "query_ids.npy"), queries.ids.astype(str)):
        raise DataError(f"{teachers_dir}: votes are for other queries; re-run the teachers stage")
    classes = read_shape(Path(public).parent).n_classes
    spec = aggregator_spec(params, teachers=votes.shape[0], classes=classes)
    # decided before the votes are looked at: the choice itself must not depend on them
    choice = decide_analysis(params, spec, len(queries), ledger)
    planned = _planned(params, spec, len(queries), choice.analysis)
    after = ledger.ensure_affordable(*planned)
    log.info("aggregate: %s on %d queries from %d teachers; %s analysis (%s); at worst the run total becomes %s",
             cfg.mechanism, len(queries), votes.shape[0], choice.analysis, choice.reason, after)

    dependent = choice.analysis == "data_dependent"
    what = "the vote noise and the smooth-sensitivity release's noise come" if dependent else "the vote noise comes"
    warn_insecure_rng(params, "aggregate", what, flow_warns=True)
    histograms = vote_histograms(votes, classes=classes)
    noise = NoiseSource(seed=seed_for(params.run.seed, "aggregate"), secure=params.privacy.secure_rng)
    asked = len(queries)
    filtered = None
    if choice.analysis == "filter":
        filtered = answer_within_budget(spec, histograms, budget_mu=filter_budget(params), noise=noise)
        labels, asked = filtered.labels, filtered.asked
    else:
        labels = spec.answer(histograms, noise=noise)
    answered = labels >= 0
    independent = data_independent_events(spec, queries=asked)
    release = private = None
    if dependent:  # computing it publishes it, so only when the ledger pays for it
        raw_curve = data_dependent_rdp(spec, histograms, orders=RDP_ORDERS)
        raw_epsilon, raw_order = rdp_privacy_accountant.compute_epsilon(RDP_ORDERS, raw_curve, ledger.delta)
        release = sanitise(spec, histograms, order=cfg.rdp_order, beta=cfg.ss_beta,
                           noise_scale=cfg.ss_noise, failure_probability=cfg.ss_failure_probability,
                           noise=NoiseSource(seed=seed_for(params.run.seed, "sanitise"),
                                             secure=params.privacy.secure_rng))
    if filtered:  # the budget fixed up front, as planned: what it spent is not the bound
        ledger.record(*planned)
    else:
        ledger.record(*([release.event()] if release else independent))

    result = Labels(
        dir=out, queries=asked, answered=int(answered.sum()), teachers=int(votes.shape[0]),
        label_accuracy=_label_accuracy(labels, queries.labels, answered),
        analysis=choice.analysis, analysis_reason=choice.reason, epsilon=ledger.stage_epsilon("aggregate").epsilon,
        epsilon_data_independent=_alone(independent, ledger),
        epsilon_sanitised=_alone([release.event()], ledger) if release else None)
    analysis = {"mechanism": cfg.mechanism, "analysis_setting": cfg.analysis, "choice": choice.public(),
                "spec": spec.public(), "sanitised_release": release.public() if release else None,
                "filter": None if filtered is None else {
                    "pool": len(queries), "asked": filtered.asked, "budget_mu": filtered.budget_mu,
                    "recorded_mu": recorded_mu(spec, budget_mu=filtered.budget_mu, pool=len(queries)),
                    "spent_mu": filtered.spent_mu},
                **result.metrics()}
    if release:
        private = {"warning": "data-dependent values: do not publish", "orders": list(RDP_ORDERS),
                   "rdp": raw_curve.tolist(), "epsilon": float(raw_epsilon), "order": float(raw_order),
                   "rdp_at_release_order": release.raw, "smooth_sensitivity": release.smooth_sensitivity}
    with staged_dir(out, made_from=made_from) as staging:
        np.save(staging / "labels.npy", labels)
        np.save(staging / "query_ids.npy", queries.ids.astype(str))
        write_json(staging / "analysis.json", analysis)
        write_text(staging / "ledger.json", ledger.to_json())
    write_json(where.metrics_file("aggregate"), result.metrics())
    if private:  # outside every DVC output and never logged: dvc push and MLflow do not see it
        write_json(where.private / "aggregate_data_dependent.json", private)
    if filtered and filtered.asked < len(queries):
        log.info("aggregate: the filter's budget stopped the queries after %d of %d", filtered.asked, len(queries))
    log.info("aggregate: %d of %d answered (label accuracy %s); stage ε = %.4g recorded (%s), "
             "data-independent ε = %.4g; run total %s", result.answered, asked,
             "unknown: an unlabeled pool" if result.label_accuracy is None else f"{result.label_accuracy:.3f}",
             result.epsilon, choice.analysis, result.epsilon_data_independent, ledger.epsilon())
    return result


@task(name="aggregate", cache_policy=NO_CACHE)
def aggregate_task(params: Params, run: TrackedRun, votes: Votes, prepared: PreparedSets,
                   projection: Projection) -> Labels:
    labels = run_aggregate(params, where=prepared.where)
    if isinstance(labels, Skipped):
        raise RuntimeError("aggregate_task runs only when student.enabled is true")
    labels.log(run)
    return labels
