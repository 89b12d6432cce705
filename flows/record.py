"""Record a pipeline that ran outside Prefect (``dvc repro``) as one MLflow run.

    privpipe stage evaluate --track

Reads the stage outputs from their files and logs them with the same functions
the flow's tasks use, so both ways of running show the same things in MLflow.
"""

from __future__ import annotations

from typing import Any

from privpipe.config import Params
from privpipe.privacy import Ledger
from tasks import paths, run_view, tracking
from tasks.common import read_json
from tasks.finetune.tracking import log_finetune_outputs
from tasks.privacy import budget
from tasks.privacy import tracking as audit_tracking
from tasks.release import track_evaluation
from tasks.removal.steps import register_pipeline_head

__all__ = ["record_finished_pipeline"]

PATE_STAGES = ("partition", "teachers", "aggregate", "student")


def record_finished_pipeline(params: Params, evaluation: dict[str, Any], *, params_file: str) -> dict[str, Any]:
    dataset = budget.dataset_name(params)
    with tracking.tracked_run(params, params_file=params_file, flow="dvc-repro", dataset=dataset) as run_id:
        prepared = read_json(paths.metrics_file("prepare"))
        tracking.log_prepare(params, run_id, prepared)
        pca = read_json(paths.metrics_file("dp_pca"))
        tracking.log_dp_pca(params, run_id, pca, Ledger.from_dict(read_json(paths.DP_PCA / "ledger.json")))
        for stage in PATE_STAGES:
            figures = read_json(paths.metrics_file(stage))
            if not figures.get("skipped"):
                tracking.log_stage_figures(params, run_id, stage, figures)
        if params.student.enabled:
            tracking.log_stage_figures(params, run_id, "teachers", {"released": False})
        if params.finetune.enabled:  # DP-SGD's per-epoch or DP-FedAvg's per-round curves
            log_finetune_outputs(params, run_id, {**read_json(paths.metrics_file("finetune")),
                                                  "history": str(paths.FINETUNE / "history.json"),
                                                  "ledger": str(paths.FINETUNE / "ledger.json")})
        # the spending stages hold the project's reservation (privpipe stage); settle it with what they
        # spent before a model is registered (the head's, then the evaluated one: MLflow lists an
        # experiment's logged models newest first, so the DP model comes first there)
        ledger = Ledger.from_dict(read_json(evaluation["ledger"]))
        audit_tracking.charge_run(params, run_id, flow="dvc-repro", dataset=dataset, ledger=ledger,
                                  data_version=prepared["data_version"], admission=None)
        if params.head.enabled:
            result_head = register_pipeline_head(params, run_id, read_json(paths.metrics_file("head")))
        else:
            result_head = {}
        result = {**track_evaluation(params, run_id, evaluation), **result_head}
        tracking.describe_run(params, run_id, run_view.headline(result, prefix=run_view.description(
            params, flow="dvc-repro", dataset=dataset, params_file=params_file)))
        audit_tracking.log_audit_view(params, run_id, dataset=dataset, ledger=ledger)
    return {**result, "run_id": run_id}
