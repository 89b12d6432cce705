"""The training pipeline as a Prefect flow:
prepare → partition → dp_pca → teachers → aggregate → student → finetune → head → evaluate.

    privpipe run [--params params.yaml]

One MLflow run per flow run; its id is passed to every task explicitly. Tasks
hand each other file paths. Teachers are mapped tasks: the task runner trains them
in parallel. ``student.enabled: false`` skips the PATE stages (finetune then starts
from scratch); ``finetune.enabled: false`` deploys the student. The flow ends with a markdown artifact (in Prefect)
that summarises the run's privacy spend.
"""

from __future__ import annotations

from typing import Any

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.client_map import mapped_client_updates
from privpipe.config import load_params
from privpipe.privacy import Ledger
from tasks import tracking
from tasks.common import read_json
from tasks.aggregate import aggregate_task, run_aggregate
from tasks.dp_pca import dp_pca_task
from tasks.evaluate import deployed_dir, evaluate_task
from tasks.finetune import finetune_task, log_finetune_outputs, run_finetune, start_dir
from tasks.head import head_task, run_head
from tasks.partition import partition_task, run_partition
from tasks.prepare import prepare_task
from tasks.student import run_student, student_task
from tasks.teachers import clear_partial_votes, collect_votes_task, run_teachers, teacher_task

__all__ = ["pipeline", "privacy_markdown"]

INSECURE_RNG_WARNING = (
    "privacy.secure_rng is false: noise and sampling (DP-SGD's lots, federated rounds' clients) come from "
    "pseudo-random generators seeded with run.seed, so the run is reproducible but whoever knows the seed "
    "can undo the noise; fine for experiments, not for a released model (set privacy.secure_rng: true)"
)


def privacy_markdown(ledger: Ledger, result: dict[str, Any]) -> str:
    summary = ledger.summary()
    lines = [
        "# privpipe run: privacy summary", "",
        f"Total: **ε = {summary['total']['epsilon']:.4f}**, δ = {summary['total']['delta']:g} "
        f"({summary['total']['accountant'].upper()} accountant, add-or-remove-one adjacency), "
        f"budget ε = {ledger.epsilon_budget:g}.", "",
        "| stage | ε (alone) | δ | accountant |", "|---|---|---|---|",
    ]
    for stage, spend in summary["stages"].items():
        lines.append(f"| {stage} | {spend['epsilon']:.4f} | {spend['delta']:g} | {spend['accountant']} |")
    lines += ["", f"Test accuracy {result['accuracy_test']:.4f}, train accuracy {result['accuracy_train']:.4f}."]
    if "accuracy_target" in result:
        lines.append(f"Target-domain accuracy {result['accuracy_target']:.4f}.")
    if "aggregate" in summary["stages"]:
        lines.append("PATE teachers were trained on the sensitive data and are never released; "
                     "only the student (and what was built on it) is.")
    if "model_version" in result:
        lines.append(f"Registered model: `{result['model_name']}` version {result['model_version']}.")
    return "\n".join(lines)


def _pate(params, run_id: str, prepared: dict[str, str], partition_dir: str, dp_pca_dir: str) -> dict[str, Any]:
    """teachers (mapped, one task each) → aggregate → student."""
    sensitive, test, public = prepared["sensitive"], prepared["test"], prepared["public"]
    clear_partial_votes()
    votes = teacher_task.map(params, range(params.partition.shards), sensitive, partition_dir, dp_pca_dir, public)
    teachers = collect_votes_task(params, run_id, public, votes)
    labels = aggregate_task(params, run_id, teachers["dir"], public, dp_pca_dir)
    return student_task(params, run_id, labels["dir"], public, test, dp_pca_dir)


@flow(name="privpipe-pipeline")
def pipeline(params_file: str = "params.yaml") -> dict[str, Any]:
    """Run every stage with the knobs in ``params_file``; return the evaluation figures and the run id."""
    params = load_params(params_file)
    log = get_run_logger()
    if not params.privacy.secure_rng:
        log.warning(INSECURE_RNG_WARNING)
    with tracking.tracked_run(params, params_file=params_file) as run_id:
        prepared = prepare_task(params, run_id)
        sensitive, test, public = prepared["sensitive"], prepared["test"], prepared["public"]
        if params.student.enabled:
            shards = partition_task(params, run_id, sensitive)
        pca = dp_pca_task(params, run_id, sensitive)
        if params.student.enabled:
            _pate(params, run_id, prepared, shards["dir"], pca["dir"])
        else:  # switched-off stages replace their outputs with a note, as under dvc repro
            for run in (run_partition, run_teachers, run_aggregate, run_student):
                run(params)
        if params.finetune.enabled and params.finetune.mode == "federated":
            # the rounds run here, in the flow, so each round's client updates are mapped tasks
            out = run_finetune(params, sensitive=Path(sensitive), test=Path(test), dp_pca_dir=Path(pca["dir"]),
                               start=start_dir(params), updates_for=mapped_client_updates)
            log_finetune_outputs(params, run_id, out)
        elif params.finetune.enabled:
            finetune_task(params, run_id, sensitive, test, pca["dir"], str(start_dir(params)))
        else:
            run_finetune(params)
        if params.head.enabled:
            head = head_task(params, run_id, sensitive, test, str(deployed_dir(params)), pca["dir"])
        else:
            head = run_head(params)
        result = evaluate_task(params, run_id, sensitive, test, str(deployed_dir(params)))
        result.update({k: v for k, v in head.items() if k.startswith("head_model")})
        if not head.get("skipped"):
            result["head"] = {k: head[k] for k in ("accuracy_test", "gradient_budget", "removal_epsilon",
                                                   "removal_delta", "features_epsilon",
                                                   "whole_certified_removal_epsilon")}
        ledger = Ledger.from_dict(read_json(result["ledger"]))
        create_markdown_artifact(key="privacy-summary", markdown=privacy_markdown(ledger, result),
                                 description="privacy spend of this run")
    return {**result, "run_id": run_id}
