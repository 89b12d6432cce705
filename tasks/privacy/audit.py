"""``privpipe audit``: one row per recorded run, read back from MLflow.

    privpipe audit [--dataset digits] [--since 2026-11-01] [--until 2026-12-01] [--csv runs.csv]

Columns: date, run, flow, dataset, data version, ε of each stage alone, PATE's aggregation
(queries asked and answered, the analysis recorded and why, its ε and the data-independent ε),
total ε and δ for one record (a federated text run's record-level form, what the lifetime budget
was charged), the accountant, test accuracy, the registered model version, and the run's status.
Only parent runs are listed (the per-stage child runs repeat their parent's figures).
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mlflow.entities import Experiment, Run, ViewType
from mlflow.tracking import MlflowClient

from privpipe.config import Params
from tasks.common import write_text

__all__ = ["AuditRow", "audit_rows", "format_table", "write_csv", "COLUMNS"]


@dataclass(frozen=True)
class AuditRow:
    """One recorded run, as ``privpipe audit`` lists it (the columns, in order)."""

    date: str  # the run's start, UTC, ISO 8601
    run: str  # the MLflow run id
    flow: str
    dataset: str
    data_version: str
    stages: str  # "<stage> <ε>; ..." for each stage alone
    pate: str  # the aggregate stage's accounting in one cell ("" without PATE)
    epsilon: float | None  # what one record cost: the lifetime ledger's figure
    delta: float | None
    accountant: str
    empirical_epsilon: float | None  # the membership audit's lower bound
    accuracy: float | None
    model: str  # the registered version, name/version
    status: str


COLUMNS = tuple(f.name for f in fields(AuditRow))


def _stage_epsilons(metrics: dict[str, float]) -> dict[str, float]:
    found = {}
    for key, value in metrics.items():
        parts = key.split(".")
        # privacy.<stage>.epsilon (the run's totals have two parts; the lifetime is not a stage)
        if len(parts) == 3 and parts[0] == "privacy" and parts[2] == "epsilon" and parts[1] != "lifetime":
            found[parts[1]] = value
    return found


def _pate(tags: dict[str, str], metrics: dict[str, float]) -> str:
    """The aggregate stage's accounting in one cell ("" for a run without PATE)."""
    if "aggregate.analysis" not in tags:
        return ""
    why = tags.get("aggregate.analysis_reason", "").split(":")[0]
    return (f"asked {tags.get('aggregate.queries', '?')}, answered {tags.get('aggregate.answered', '?')}, "
            f"{tags['aggregate.analysis']} ({why}), ε {metrics.get('aggregate.epsilon', float('nan')):.4g}, "
            f"data-independent ε {metrics.get('aggregate.epsilon_data_independent', float('nan')):.4g}")


def audit_rows(params: Params, client: MlflowClient, *, dataset: str | None = None, since: datetime | None = None,
               until: datetime | None = None, every_experiment: bool = False) -> list[AuditRow]:
    """The runs that privpipe recorded, oldest first, filtered: of ``run.experiment``, or with
    ``every_experiment`` of every experiment in the store (each params file may name its own)."""
    experiments: list[Experiment]
    if every_experiment:
        experiments = list(client.search_experiments(view_type=ViewType.ACTIVE_ONLY))
    else:
        found = client.get_experiment_by_name(params.run.experiment)
        experiments = [found] if found is not None else []
    if not experiments:
        return []
    clauses = ["tags.`privpipe.flow` != ''"]
    if dataset:
        clauses.append(f"tags.`privpipe.dataset` = '{dataset.replace(chr(39), '')}'")
    if since:
        clauses.append(f"attributes.start_time >= {int(since.timestamp() * 1000)}")
    if until:
        clauses.append(f"attributes.start_time < {int(until.timestamp() * 1000)}")
    rows, token = [], None
    while True:
        page = client.search_runs([e.experiment_id for e in experiments], filter_string=" and ".join(clauses),
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=1000,
                                  order_by=["attributes.start_time ASC"], page_token=token)
        rows += [_row(run) for run in page if "mlflow.parentRunId" not in run.data.tags]
        token = page.token
        if not token:
            return rows


def _row(run: Run) -> AuditRow:
    tags, metrics = run.data.tags, run.data.metrics
    stages = _stage_epsilons(metrics)
    return AuditRow(
        date=datetime.fromtimestamp(run.info.start_time / 1000, UTC).isoformat(timespec="seconds"),
        run=run.info.run_id, flow=tags.get("privpipe.flow", ""), dataset=tags.get("privpipe.dataset", ""),
        data_version=tags.get("dvc.data_version", ""),
        stages="; ".join(f"{stage} {eps:.4g}" for stage, eps in stages.items()),
        pate=_pate(tags, metrics),
        # what one record cost, the figure the lifetime ledger adds up: a federated text run's
        # privacy.epsilon is client-level, its record-level form is privacy.record_epsilon
        epsilon=metrics.get("privacy.record_epsilon", metrics.get("privacy.epsilon")),
        delta=metrics.get("privacy.delta"),
        accountant=tags.get("privacy.record_accountant", tags.get("privacy.accountant", "")),
        # the membership audit's lower bound: never above that ε, or the run would have failed
        empirical_epsilon=metrics.get("privacy.audit.epsilon_lower_bound"), accuracy=metrics.get("accuracy.test"),
        model=tags.get("registered_model", ""), status=run.info.status)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_table(rows: list[AuditRow]) -> str:
    shown = [{**asdict(r), "run": r.run[:12], "data_version": r.data_version[:16]} for r in rows]
    widths = {c: max([len(c)] + [len(_cell(r[c])) for r in shown]) for c in COLUMNS}
    lines = ["  ".join(c.ljust(widths[c]) for c in COLUMNS)]
    lines += ["  ".join(_cell(r[c]).ljust(widths[c]) for c in COLUMNS) for r in shown]
    return "\n".join(lines)


def write_csv(rows: list[AuditRow], path: Path) -> None:
    """Full run ids and versions, one row per run (written whole or not at all)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({c: "" if v is None else v for c, v in asdict(r).items()} for r in rows)
    write_text(path, buffer.getvalue())
