"""The training pipeline as a Prefect flow:
prepare → partition → dp_pca → teachers → aggregate → student → finetune → head → evaluate.

    privpipe run [--params params.yaml]

One MLflow run per flow run, with a child run per stage; its id is passed to every task
explicitly. Tasks hand each other file paths. Teachers (and federated clients) are mapped
tasks on the runner ``runner`` in params.yaml chooses (threads, processes, Dask, Ray).
``student.enabled: false`` skips the PATE stages (finetune then starts from scratch);
``finetune.enabled: false`` deploys the student.

Before any work the run reserves its most on the dataset's lifetime budget, beside what other
runs hold (refused if it cannot); at the end its spend replaces the reservation
(``privpipe budget``). The flow ends with a markdown artifact (in Prefect) that summarises
the run's privacy spend, data version and model, and links to the MLflow run (which is
tagged with the flow run: ``prefect.flow_run_id``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, unmapped
from prefect.artifacts import create_markdown_artifact
from prefect.futures import as_completed
from prefect.runtime import flow_run

from flows.client_map import mapped_client_updates
from flows.runner import describe_runner, mapping_runner
from privpipe.config import Params, check_pipeline_use, load_params
from privpipe.privacy import Ledger
from tasks import paths, run_view, tracking
from tasks.common import one_pipeline_at_a_time, read_json, use_torch_threads
from tasks.device import training_device
from tasks.dp_pca import check_components, dp_pca_task
from tasks.evaluate import evaluate_task, release_task
from tasks.finetune.stage import check_lot_size, finetune_task, run_finetune, start_dir
from tasks.finetune.tracking import log_finetune_outputs
from tasks.pate.aggregate import aggregate_task, run_aggregate
from tasks.pate.partition import partition_task, run_partition, shard_assignment
from tasks.pate.student import run_student, student_task
from tasks.pate.teachers import clear_partial_votes, collect_votes_task, run_teachers, teacher_task
from tasks.prepare import prepare_task, prepared_sets
from tasks.privacy import budget
from tasks.privacy import tracking as audit_tracking
from tasks.progress import progress
from tasks.removal.head import head_task, run_head

__all__ = ["pipeline", "privacy_markdown"]


INSECURE_RNG_WARNING = (
    "privacy.secure_rng is false: noise and sampling (DP-SGD's lots, federated rounds' clients) come from "
    "pseudo-random generators seeded with run.seed, so the run is reproducible but whoever knows the seed "
    "can undo the noise; fine for experiments, not for a released model (set privacy.secure_rng: true)"
)


def privacy_markdown(ledger: Ledger, result: dict[str, Any], *, mlflow_url: str | None = None) -> str:
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
    lines += ["", f"Test accuracy {result['accuracy_test']:.4f}."]  # train accuracy: not covered by ε
    if "accuracy_target" in result:
        lines.append(f"Target-domain accuracy {result['accuracy_target']:.4f}.")
    if "aggregate" in summary["stages"]:
        lines.append("PATE teachers were trained on the sensitive data and are never released; "
                     "only the student (and what was built on it) is.")
    if "model_version" in result:
        lines.append(f"Registered model: `{result['model_name']}` version {result['model_version']}.")
    lines.append(f"Data version: `{result['data_version']}`.")
    if "lifetime" in result:
        life = result["lifetime"]
        lines.append(f"Lifetime budget of dataset `{life['dataset']}` after this run: spent ε = {life['spent']:.4g} "
                     f"(δ = {life['spent_delta']:.3g}) over {life['runs']} run(s), left ε = {life['left']:.4g} of "
                     f"{life['budget']:g} (basic composition).")
    if mlflow_url:
        lines += ["", f"MLflow run: [{mlflow_url}]({mlflow_url})"]
    return "\n".join(lines)


class _Stopwatch:
    """Wall seconds of each stage as the flow runs it (what the per-stage child runs record)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, stage: str, run, *args, **kwargs):
        start = time.perf_counter()
        try:
            return run(*args, **kwargs)
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start


def _teachers(params, runner, prepared: dict[str, str], partition_dir: str, dp_pca_dir: str) -> list[str]:
    """One mapped task per teacher on the chosen runner; a bar on the terminal as they finish."""
    futures = runner.map(teacher_task, {
        "params": unmapped(params), "teacher": range(params.partition.shards),
        "sensitive": unmapped(prepared["sensitive"]), "partition_dir": unmapped(partition_dir),
        "dp_pca_dir": unmapped(dp_pca_dir), "public": unmapped(prepared["public"])})
    with progress(len(futures), "teachers") as bar:
        for _ in as_completed(futures):
            bar.update()
    return futures.result()


def preflight(params: Params) -> None:
    """Load and check the data and the partition the run would make, writing nothing: ``privpipe run``
    calls it before Prefect, MLflow or the pipeline lock exist, so bad input leaves no trace."""
    check_pipeline_use(params)
    training_device(params)  # run.device: cuda on a machine without one is refused here, not mid-run
    sets, *_ = prepared_sets(params)
    if params.student.enabled:
        shard_assignment(params, sets["sensitive"], source=params.prepare.path)
    # each stage's own checks against the data, made here too: mid-run they would fail after MLflow wrote
    check_components(params, sets["sensitive"].features.shape[1])
    check_lot_size(params, len(sets["sensitive"]))


@flow(name="privpipe-pipeline")
def pipeline(params_file: str = "params.yaml") -> dict[str, Any]:
    """Run every stage with the knobs in ``params_file``; return the evaluation figures and the run id.

    One run at a time (a lock under artifacts/); refused before any work if the dataset's
    lifetime budget cannot pay for the run's ``privacy.epsilon_budget``."""
    params = load_params(params_file)
    check_pipeline_use(params)  # a deployment's run starts here, not in preflight
    training_device(params)
    log = get_run_logger()
    if not params.privacy.secure_rng:
        log.warning(INSECURE_RNG_WARNING)
    # the stages that run in this thread (prepare, partition, head) included; each stage sets it again
    use_torch_threads(params, "pipeline")
    dataset = budget.dataset_name(params)
    with one_pipeline_at_a_time(), \
            budget.admitted(params, dataset, what="pipeline run", flow="pipeline") as admission:
        with tracking.tracked_run(params, params_file=params_file, flow="pipeline", dataset=dataset,
                                  exclusive=True) as run_id, \
                mapping_runner(params) as runner:
            log.info("pipeline: mapped tasks run on %s", describe_runner(params))
            result, seconds = _stages(params, run_id, runner, dataset, admission)
            ledger = Ledger.from_dict(read_json(result["ledger"]))
            tracking.describe_run(params, run_id, run_view.headline(result, prefix=run_view.description(
                params, flow="pipeline", dataset=dataset, params_file=params_file)))
            audit_tracking.log_audit_view(params, run_id, dataset=dataset, ledger=ledger, seconds=seconds)
            markdown = privacy_markdown(ledger, result, mlflow_url=tracking.run_url(params, run_id))
            create_markdown_artifact(key="privacy-summary", markdown=markdown, description="privacy spend of this run")
    return {**result, "run_id": run_id, "flow_run_id": str(flow_run.id)}


def _stages(params, run_id: str, runner, dataset: str,
            admission: budget.Admission) -> tuple[dict[str, Any], dict[str, float]]:
    timed = _Stopwatch()
    prepared = timed("prepare", prepare_task, params, run_id)
    sensitive, test, public = prepared["sensitive"], prepared["test"], prepared["public"]
    if params.student.enabled:
        shards = timed("partition", partition_task, params, run_id, sensitive)
    admission.mark_published()  # the spending stages log their figures as they go
    pca = timed("dp_pca", dp_pca_task, params, run_id, sensitive)
    if params.student.enabled:
        clear_partial_votes()
        votes = timed("teachers", _teachers, params, runner, prepared, shards["dir"], pca["dir"])
        teachers = timed("teachers", collect_votes_task, params, run_id, public, votes)
        labels = timed("aggregate", aggregate_task, params, run_id, teachers["dir"], public, pca["dir"])
        timed("student", student_task, params, run_id, labels["dir"], public, test, pca["dir"])
    else:  # switched-off stages replace their outputs with a note, as under dvc repro
        for run in (run_partition, run_teachers, run_aggregate, run_student):
            run(params)
    if params.finetune.enabled and params.finetune.mode == "federated":
        # the rounds run here, in the flow, so each round's client updates are mapped tasks
        out = timed("finetune", run_finetune, params, sensitive=Path(sensitive), test=Path(test),
                    dp_pca_dir=Path(pca["dir"]), start=start_dir(params), updates_for=mapped_client_updates(runner))
        log_finetune_outputs(params, run_id, out)
    elif params.finetune.enabled:
        timed("finetune", finetune_task, params, run_id, sensitive, test, pca["dir"], str(start_dir(params)))
    else:
        run_finetune(params)
    # the ledger is final: charge the dataset's lifetime budget before anything is released
    # (the evaluated model, then the head built on it)
    lifetime = audit_tracking.charge_run(params, run_id, flow="pipeline", dataset=dataset,
                                         ledger=Ledger.from_dict(read_json(paths.deployed_dir(params) / "ledger.json")),
                                         data_version=prepared["data_version"], admission=admission)
    # evaluate first: its privacy audit must pass before any model, or anything built on it, is registered
    result = timed("evaluate", evaluate_task, params, run_id, sensitive, test, str(paths.deployed_dir(params)))
    if params.head.enabled:
        head = timed("head", head_task, params, run_id, sensitive, test, str(paths.deployed_dir(params)), pca["dir"])
    else:
        head = run_head(params)
    # the DP model is logged last: MLflow lists an experiment's logged models newest first, so it comes
    # before the head (not DP) there, as in a dvc repro run's record
    result = timed("evaluate", release_task, params, run_id, result)
    result.update({k: v for k, v in head.items() if k.startswith("head_model")})
    result["data_version"] = prepared["data_version"]
    result["lifetime"] = lifetime.summary()
    if not head.get("skipped"):
        result["head"] = {k: head[k] for k in ("accuracy_test", "gradient_budget", "removal_epsilon",
                                               "removal_delta", "features_epsilon",
                                               "whole_certified_removal_epsilon")}
    return result, timed.seconds
