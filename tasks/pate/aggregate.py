"""aggregate: label the public queries by noisy teacher vote, and account for it.

    privpipe stage aggregate        # what dvc repro runs

Decides the analysis first, from public information only: ``aggregate.analysis`` names a mode
(privpipe.pate.analysis_modes), which picks the analysis the ledger records before any vote is seen.
``auto`` uses data-dependent accounting only if its best case (the expected sanitised release when
every query's votes are alike, at the best top count, plus the release's own cost) beats the
data-independent events in the run's ε; a forced ``data_dependent`` that cannot win is refused before
any noise is drawn; ``data_independent`` charges the aggregator's own events. Then checks the
worst case against the budget, aggregates (``aggregate.mechanism``) and records what the analysis
says: the data-independent events or the sanitised data-dependent release. Every query asked is
charged, answered or not: which ones were answered depends on the votes. ``aggregate.analysis:
{filter: {epsilon: ε}}`` instead asks the queries in order under a GDP budget fixed by that ε
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
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import Params
from privpipe.config.privacy import ACCOUNTANTS
from privpipe.data import UNLABELED, DataError
from privpipe.pate.aggregators import Aggregator, make_aggregator
from privpipe.pate.analysis_modes import Analysis, Setting, analysis_mode, epsilon_alone
from privpipe.pate.teachers import vote_histograms
from privpipe.privacy import Ledger, NoiseSource
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

__all__ = ["Labels", "run_aggregate", "aggregate_task", "decide_analysis", "check_analysis"]


def check_analysis(params: Params, *, classes: int) -> None:
    """What ``aggregate.analysis`` cannot run with these settings, refused before any work (a filter whose budget
    holds not even one query at its worst would ask nothing)."""
    if not params.student.enabled:
        return
    analysis_mode(params.aggregate.analysis).check(params.aggregate.mechanism, teachers=params.partition.shards,
                                                   classes=classes, delta=params.privacy.delta)


def decide_analysis(params: Params, aggregator: Aggregator, queries: int, ledger: Ledger) -> Analysis:
    """The analysis to record, from the settings, the query count and the ledger so far (no votes).
    A forced ``data_dependent`` that cannot win is a ConfigError: its release cost would be wasted."""
    setting = Setting(aggregator, queries=queries, ledger=ledger, config=params.aggregate,
                      accountant=ACCOUNTANTS[params.privacy.accountant])
    return analysis_mode(params.aggregate.analysis).decide(setting)


@dataclass(frozen=True)
class Labels:
    """The aggregate stage's output: the noisy labels of the public queries (−1: unanswered) under ``dir``, the
    run's ledger so far, and the stage's public figures."""

    dir: Path
    queries: int  # asked (each one charged; under the filter, its argmax only when answered)
    answered: int
    teachers: int
    label_accuracy: float | None  # against the public pool's own labels, on the answered queries (None: unlabeled)
    analysis: str  # data_dependent | data_independent | filter, decided before the votes were seen
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
    aggregator = make_aggregator(cfg.mechanism, votes.shape[0], classes)
    # decided before the votes are looked at: the choice itself must not depend on them
    analysis = decide_analysis(params, aggregator, len(queries), ledger)
    choice = analysis.choice
    after = ledger.ensure_affordable(*analysis.planned())
    log.info("aggregate: %s on %d queries from %d teachers; %s analysis (%s); at worst the run total becomes %s",
             cfg.mechanism, len(queries), votes.shape[0], choice.analysis, choice.reason, after)

    warn_insecure_rng(params, "aggregate", analysis.noise_drawn, flow_warns=True)
    histograms = vote_histograms(votes, classes=classes)
    answers = analysis.answer(
        histograms, noise=NoiseSource(seed=seed_for(params.run.seed, "aggregate"), secure=params.privacy.secure_rng),
        release_noise=NoiseSource(seed=seed_for(params.run.seed, "sanitise"), secure=params.privacy.secure_rng))
    ledger.record(*answers.recorded)

    labels, release = answers.labels, answers.release
    answered = labels >= 0
    result = Labels(
        dir=out, queries=answers.asked, answered=int(answered.sum()), teachers=int(votes.shape[0]),
        label_accuracy=_label_accuracy(labels, queries.labels, answered),
        analysis=choice.analysis, analysis_reason=choice.reason, epsilon=ledger.stage_epsilon("aggregate").epsilon,
        epsilon_data_independent=epsilon_alone(answers.data_independent, ledger),
        epsilon_sanitised=epsilon_alone([release.event()], ledger) if release else None)
    summary = {"mechanism": cfg.mechanism.tag, "analysis_setting": cfg.analysis.tag, "choice": choice.public(),
               "spec": aggregator.public(), "sanitised_release": release.public() if release else None,
               "filter": answers.filter, **result.metrics()}
    with staged_dir(out, made_from=made_from) as staging:
        np.save(staging / "labels.npy", labels)
        np.save(staging / "query_ids.npy", queries.ids.astype(str))
        write_json(staging / "analysis.json", summary)
        write_text(staging / "ledger.json", ledger.to_json())
    write_json(where.metrics_file("aggregate"), result.metrics())
    if answers.private:  # outside every DVC output and never logged: dvc push and MLflow do not see it
        write_json(where.private / "aggregate_data_dependent.json", answers.private)
    for note in answers.notes:
        log.info("aggregate: %s", note)
    log.info("aggregate: %d of %d answered (label accuracy %s); stage ε = %.4g recorded (%s), "
             "data-independent ε = %.4g; run total %s", result.answered, answers.asked,
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
