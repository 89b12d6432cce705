"""What an auditor sees in MLflow at the end of a run, without code.

- one child run per stage under the run (tag ``mlflow.parentRunId``): the stage's parameters,
  its figures and ``privacy.<stage>.*`` metrics (curves included) and tags, its wall time;
- the dataset's lifetime spend: ``privacy.lifetime.epsilon`` and ``…epsilon_remaining`` metrics, the
  rest as ``privacy.lifetime.*`` tags, and ``privacy/lifetime.json``;
- the plots of :mod:`tasks.privacy.plots` as artifacts.

:func:`charge_run` adds a training run's spend to the dataset's lifetime ledger
(:mod:`tasks.privacy.budget`), in place of its reservation, just before the model is
registered, and mirrors it here;
:func:`log_audit_view` is the last step of the flow.
"""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from mlflow.entities import Metric

from privpipe.config import Params
from privpipe.privacy import Ledger, LifetimeLedger
from tasks import run_view, tracking
from tasks.privacy import budget
from tasks.privacy.audit import audit_rows
from tasks.privacy.plots import epsilon_by_stage_figure, frontier_figure, lifetime_figure
from tasks.tracking import TrackedRun

__all__ = ["log_stage_runs", "log_lifetime", "charge_run", "log_audit_view", "CURVES", "stage_seconds"]

#: ε-over-progress curves the stages log (drawn in plots/epsilon_by_stage.png)
CURVES = ("privacy.finetune.epsilon_by_step", "privacy.finetune.epsilon_by_round",
          "privacy.federated.epsilon_by_round")
#: metric prefixes that belong to a stage besides ``<stage>.`` and ``privacy.<stage>.``
_EXTRA_PREFIXES = {"prepare": ("data.",), "evaluate": ("accuracy.", "privacy.audit.")}


def log_stage_runs(params: Params, run: TrackedRun, seconds: dict[str, float | None]) -> dict[str, str]:
    """A child run per stage (in the order run), holding what the parent logged about it; a stage whose
    seconds are None has its time withheld (a private recipe selection's would tell how many runs it made)."""
    client, parent_id = run.client, run.run_id
    parent = client.get_run(parent_id)
    flat = params.flat()
    children = {}
    for stage, wall in seconds.items():
        prefixes = (f"{stage}.", f"privacy.{stage}.", *_EXTRA_PREFIXES.get(stage, ()))
        child = client.create_run(parent.info.experiment_id, run_name=stage, tags={
            "mlflow.parentRunId": parent_id, "privpipe.stage": stage,
            "mlflow.note.content": f"stage {stage} of run {parent.info.run_name} ("
                                   f"{stage_seconds(wall) if wall is not None else WITHHELD_TIME})",
            **{k: v for k, v in parent.data.tags.items()
               if k.startswith((*prefixes, "privpipe.", "dvc.", "mlflow.source.")) and k != "privpipe.flow"}})
        run_id = child.info.run_id
        metrics: list[Metric | tuple[str, float, int]] = [("stage.seconds", wall, 0)] if wall is not None else []
        for key in parent.data.metrics:
            if key.startswith(prefixes):
                metrics += client.get_metric_history(parent_id, key)
        own = (f"{stage}.", "privacy_audit.") if stage == "evaluate" else (f"{stage}.",)
        tracking.log_batch(client, run_id, metrics=metrics,
                           params={k: v for k, v in sorted(flat.items()) if k.startswith(own)})
        client.set_terminated(run_id, "FINISHED")
        children[stage] = run_id
    return children


WITHHELD_TIME = "time withheld: it grows with the private recipe selection's secret number of runs"


def stage_seconds(wall: float) -> str:
    return f"{wall:.1f} s" if wall < 120 else f"{wall / 60:.1f} min"


def log_lifetime(run: TrackedRun, lifetime: LifetimeLedger) -> None:
    """The spend and what is left as metrics (compared across runs), budgets and counts as tags."""
    life = lifetime.summary()
    run.log_batch(metrics={"privacy.lifetime.epsilon": life["spent"],
                           "privacy.lifetime.epsilon_remaining": life["left"]},
                  tags={**{key: run_view.format_value(value) for key, value in {
                      "privacy.lifetime.delta": life["spent_delta"], "privacy.lifetime.epsilon_budget": life["budget"],
                      "privacy.lifetime.delta_budget": life["delta_budget"],
                      "privacy.lifetime.delta_remaining": life["left_delta"], "privacy.lifetime.runs": life["runs"],
                      "privacy.lifetime.epsilon_reserved": life["reserved"],
                      "privacy.lifetime.runs_in_progress": life["in_progress"]}.items()},
                        "privacy.lifetime.composition": "basic (runs' ε and δ add up)"})
    run.log_text(json.dumps(lifetime.to_dict(), indent=2), "privacy/lifetime.json")
    _figure(run, lifetime_figure(lifetime), "plots/lifetime_budget.png")


def _figure(run: TrackedRun, figure: Figure, name: str) -> None:
    run.log_figure(figure, name)
    plt.close(figure)


def charge_run(params: Params, run: TrackedRun, *, flow: str, dataset: str, ledger: Ledger, data_version: str,
               admission: budget.Admission | None) -> LifetimeLedger:
    """Add the run's spend to the dataset's lifetime ledger, in place of its reservation
    (``admission``; None: the project's stage reservation, as dvc repro holds it), and mirror it here.

    Called once the run's ledger is final and *before* the model is registered: a run that
    dies after this has been charged for a model it never released (too much, never too
    little); one that dies before it still holds its reservation until it is known to have
    released nothing."""
    entry = budget.spend_of_run(run_id=run.run_id, flow=flow, data_version=data_version, ledger=ledger)
    if admission is not None:
        lifetime = admission.charge(entry)
    else:
        lifetime = budget.charge_stages(params, dataset, entry, what=f"{flow} run {run.run_id}")
    log_lifetime(run, lifetime)
    return lifetime


def log_audit_view(params: Params, run: TrackedRun, *, dataset: str, ledger: Ledger,
                   seconds: dict[str, float | None] | None = None) -> None:
    """The plots (ε by stage, accuracy vs ε over the dataset's runs) and the per-stage child runs."""
    curves = {key.split(".", 1)[1]: [(m.step, m.value) for m in run.client.get_metric_history(run.run_id, key)]
              for key in CURVES}
    _figure(run, epsilon_by_stage_figure(ledger, {k: v for k, v in curves.items() if v}), "plots/epsilon_by_stage.png")
    runs = audit_rows(params, run.client, dataset=dataset)
    _figure(run, frontier_figure(runs, run.run_id), "plots/accuracy_vs_epsilon.png")
    if seconds:
        log_stage_runs(params, run, seconds)

