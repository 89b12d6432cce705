"""The training pipeline as a Prefect flow:
prepare → partition → dp_pca → teachers → aggregate → student → finetune → head → evaluate.

    privpipe run [--params params.yaml]

One MLflow run per flow run, with a child run per stage; its id is passed to every task
explicitly. Tasks hand each other file paths. Teachers (and federated clients) are mapped
tasks on the runner ``runner`` in params.yaml chooses (threads, processes, Dask, Ray).
``student.enabled: false`` skips the PATE stages (finetune then starts from scratch);
``finetune.enabled: false`` deploys the student.

Before any work the run checks its params and data (:func:`preflighted`: the data prepared into a scratch folder,
which the prepare stage adopts, so a run reads its data once); ``privpipe run`` makes those checks before Prefect
starts and hands them to the flow. Then it reserves its most on the dataset's lifetime budget, beside what other
runs hold (refused if it cannot); at the end its spend replaces the reservation
(``privpipe budget``). A run that fails before its first figure computed from the sensitive records
leaves (a crash while DP-SGD trains, say) gives its reservation back; one that fails after is charged it.
The flow ends with a markdown artifact (in Prefect) that summarises the run's privacy spend, data
version and model, and links to the MLflow run (which is tagged with the flow run: ``prefect.flow_run_id``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from prefect import flow, get_run_logger, unmapped
from prefect.artifacts import create_markdown_artifact
from prefect.futures import as_completed
from prefect.runtime import flow_run
from prefect.task_runners import TaskRunner

from flows.client_map import mapped_client_updates
from flows.heap import settle_heap
from flows.runner import describe_runner, mapping_runner
from privpipe.config import Params, check_federated_use, check_pipeline_use
from privpipe.data.partitioned import PartJob, PartMapper, PartResult
from privpipe.privacy import Ledger, LifetimeLedger
from tasks import run_view, tracking
from tasks.common import Skipped, one_pipeline_at_a_time, read_json, use_torch_threads
from tasks.device import training_device
from tasks.discovery import check_sources, discovery_plan
from tasks.dp_pca import check_components, dp_pca_task
from tasks.evaluate import evaluate_task, release_task
from tasks.evaluation import Evaluation
from tasks.features import check_model
from tasks.federated.training import assign_clients
from tasks.finetune.stage import check_lot_size, check_target_reachable, finetune_task, run_finetune
from tasks.pate.aggregate import aggregate_task, check_analysis, run_aggregate
from tasks.pate.partition import Shards, partition_task, run_partition, shard_assignment
from tasks.pate.student import run_student, student_task
from tasks.pate.teachers import clear_partial_votes, collect_votes_task, run_teachers, teacher_task
from tasks.prepare import (
    Prepared,
    PreparedAhead,
    partitioned_table,
    prepare_part_task,
    prepare_task,
    prepared_ahead,
    run_prepare,
)
from tasks.prepared import PreparedSets
from tasks.privacy import budget, uncovered
from tasks.privacy import tracking as audit_tracking
from tasks.progress import progress
from tasks.projection import Projection
from tasks.recipe import load_run_params
from tasks.registered import RegisteredModel
from tasks.removal.head import head_task, run_head
from tasks.removal.store import HeadVersion, head_model_name

__all__ = ["pipeline", "privacy_markdown", "RunResult", "StageClock", "Preflight", "preflighted"]


INSECURE_RNG_WARNING = (
    "privacy.secure_rng is false: noise and sampling (DP-SGD's lots, federated rounds' clients) come from "
    "pseudo-random generators seeded with run.seed, so the run is reproducible but whoever knows the seed "
    "can undo the noise; fine for experiments, not for a released model (set privacy.secure_rng: true)"
)


@dataclass(frozen=True)
class RunResult:
    """What a pipeline run produced: the evaluation of the released model, its registered version, the
    removal head, the data version, the dataset's lifetime spend after the run, and where it is recorded."""

    evaluation: Evaluation
    model: RegisteredModel | None  # None when evaluate.register_model is false
    head: HeadVersion | None  # None when head.enabled is false
    data_version: str
    lifetime: LifetimeLedger
    run_id: str = ""
    flow_run_id: str = ""
    url_hint: str = ""  # how to open the MLflow run (the ``mlflow ui`` command and the run's address)

    def headline(self, prefix: str) -> str:
        """The run's one line in MLflow: what it was, test accuracy, ε and the registered models."""
        models = [f"model {self.model}"] if self.model else []
        if self.head is not None and self.head.registered is not None:
            models.append(f"removal head {self.head.registered} (not DP)")
        line = run_view.headline(prefix, accuracy_test=self.evaluation.accuracy_test,
                                 epsilon=self.evaluation.epsilon, delta=self.evaluation.delta, models=models)
        stages = self.evaluation.ledger().stages()
        if len(stages) > 1:  # the per-stage figures beside it do not add up to it, and the UI should say why
            line += (f". That ε composes the {len(stages)} stages' events ({', '.join(stages)}) by the run's "
                     "accountant: less than the sum of the privacy.<stage>.epsilon figures, each that stage alone")
        return line


def privacy_markdown(ledger: Ledger, result: RunResult, *, mlflow_url: str | None = None) -> str:
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
    evaluation = result.evaluation
    lines += ["", f"Test accuracy {evaluation.accuracy_test:.4f}."]  # train accuracy: not covered by ε
    if evaluation.accuracy_target is not None:
        lines.append(f"Target-domain accuracy {evaluation.accuracy_target:.4f}.")
    if "aggregate" in summary["stages"]:
        lines.append("PATE teachers were trained on the sensitive data and are never released; "
                     "only the student (and what was built on it) is.")
    if result.model is not None:
        lines.append(f"Registered model: `{result.model.name}` version {result.model.version}.")
    lines.append(f"Data version: `{result.data_version}`.")
    life = result.lifetime.summary()
    lines.append(f"Lifetime budget of dataset `{life['dataset']}` after this run: spent ε = {life['spent']:.4g} "
                 f"(δ = {life['spent_delta']:.3g}) over {life['runs']} run(s), left ε = {life['left']:.4g} of "
                 f"{life['budget']:g} (basic composition).")
    if mlflow_url:
        lines += ["", f"MLflow run: [{mlflow_url}]({mlflow_url})"]
    return "\n".join(lines)


@dataclass
class StageClock:
    """Wall seconds of each stage as the flow runs it (what the per-stage child runs record); None for a
    stage whose time is withheld. Each stage ends with :func:`flows.heap.settle_heap`, on its clock."""

    seconds: dict[str, float | None] = field(default_factory=dict)

    @contextmanager
    def timed(self, stage: str, *, withheld: bool = False) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            settle_heap()
            elapsed = time.perf_counter() - start
            before = self.seconds.get(stage, 0.0)
            self.seconds[stage] = None if withheld or before is None else before + elapsed


def _mapped_parts(runner: TaskRunner) -> PartMapper:
    """A partitioned table's parts, one mapped task each on the chosen runner."""
    def map_parts(jobs: list[PartJob]) -> list[PartResult]:
        futures = runner.map(prepare_part_task, {"job": jobs})  # type: ignore[arg-type]  # (as _teachers says)
        return cast(list[PartResult], futures.result())

    return map_parts


def _teachers(params: Params, runner: TaskRunner, prepared: PreparedSets, shards: Shards,
              projection: Projection) -> list[Path]:
    """One mapped task per teacher on the chosen runner; a bar on the terminal as they finish."""
    # Prefect types map() for a task whose result may be a coroutine (R is invariant): a sync task fits at run time
    futures = runner.map(teacher_task, {  # type: ignore[arg-type]
        "params": unmapped(params), "teacher": range(params.partition.shards), "prepared": unmapped(prepared),
        "shards": unmapped(shards), "projection": unmapped(projection)})
    with progress(len(futures), "teachers") as bar:
        for _ in as_completed(futures):
            bar.update()
    # each teacher's votes file (the map's futures resolve to teacher_task's results)
    return [Path(file) for file in cast(list[str], futures.result())]


@dataclass(eq=False)  # one run's checks: found by identity
class Preflight:
    """A run's checks before any work, passed: the params they checked, and the sets they prepared (in a scratch
    folder) for the prepare stage to adopt; None where the checks that read the sets wait for the schema the run
    discovers (made under its admission, :func:`_prepare`)."""

    params: Params
    ahead: PreparedAhead | None


#: the checks ``privpipe run`` made before Prefect started, handed to the pipeline flow it starts in this process
_HANDED: list[Preflight] = []


@contextmanager
def preflighted(params: Params, *, hand_over: bool = False) -> Iterator[Preflight]:
    """Every check before any work, the data's preparation kept for the block: ``privpipe run`` enters it before
    Prefect, MLflow or the pipeline lock exist, so bad input leaves no trace (the scratch folder is removed on
    leaving: on a refusal, at the end of the run, or, for a killed run, by the next one). ``hand_over``: the
    pipeline flow started inside the block with the same params takes these checks as its own, and its prepare
    stage adopts the sets they prepared (the data read and checked once)."""
    with _checked_input(params) as ahead:
        registry_preflight(params)
        checked = Preflight(params=params, ahead=ahead)
        if not hand_over:
            yield checked
            return
        _HANDED.append(checked)
        try:
            yield checked
        finally:
            if checked in _HANDED:  # no flow took it
                _HANDED.remove(checked)


@contextmanager
def _checked_input(params: Params) -> Iterator[PreparedAhead | None]:
    check_pipeline_use(params)
    training_device(params)  # run.device: cuda on a machine without one is refused here, not mid-run
    plan = discovery_plan(params)
    if plan is not None:
        # the checks below read the data through the schema the run discovers: that draw is a release, made
        # under the run's admission (a refusal after it is charged, _prepare), never here, uncharged
        check_sources(params, plan)
        yield None
        return
    with checked_data(params) as ahead:
        yield ahead


@contextmanager
def _this_runs_checks(params: Params) -> Iterator[Preflight]:
    """The checks ``privpipe run`` handed over for these params, or (a deployment's run, which starts here) the
    flow's own, made now."""
    handed = next((checked for checked in _HANDED if checked.params == params), None)
    if handed is not None:
        _HANDED.remove(handed)  # one flow run's: its owner's block removes its scratch folder
        yield handed
        return
    with preflighted(params) as checked:
        yield checked


@contextmanager
def checked_data(params: Params) -> Iterator[PreparedAhead]:
    """The checks of the data and of what each stage makes of it (preflight, or once the schema is drawn), on
    the sets prepared into a scratch folder (bounded memory), kept for the block for the prepare stage to adopt."""
    with prepared_ahead(params) as ahead:
        _check_prepared(params, ahead.prepared)
        yield ahead


def _check_prepared(params: Params, prepared: Prepared) -> None:
    if params.student.enabled:
        shard_assignment(params, prepared.sensitive, classes=prepared.shape.n_classes, source=params.prepare.path)
        check_analysis(params, classes=prepared.shape.n_classes)
    # each stage's own checks against the data, made here too: mid-run they would fail after MLflow wrote
    check_components(params, prepared.shape.width)
    check_lot_size(params, len(prepared.sensitive))
    check_target_reachable(params, len(prepared.sensitive),
                           spent=[prepared.discovered.event] if prepared.discovered else [])
    check_model(params, prepared.shape)
    if params.finetune.enabled and params.finetune.mode == "federated":  # the clients finetune would make
        sensitive = prepared.sensitive
        _, clients = assign_clients(params, ids=sensitive.ids, labels=sensitive.labels,
                                    classes=prepared.shape.n_classes,
                                    natural=sensitive.clients if params.federated.client_column else None)
        check_federated_use(params, clients=clients)  # natural clients: K (public) is known only now


def registry_preflight(params: Params) -> None:
    """The model names the run registers under hold no other dataset's versions (ConfigError naming
    run.model_name), checked before any work; MLflow's store is read, never made, here."""
    names = {params.run.model_name: "run.model_name"}
    if params.head.enabled:
        names[head_model_name(params)] = "run.model_name"
    tracking.ensure_models_of(params, budget.dataset_name(params), names)


@flow(name="privpipe-pipeline")
def pipeline(params_file: str = "params.yaml") -> RunResult:
    """Run every stage with the knobs in ``params_file``; return what it produced and where it is recorded.

    One run at a time (a lock under artifacts/); refused before any work if the dataset's
    lifetime budget cannot pay for the run's ``privacy.epsilon_budget``."""
    params = load_run_params(params_file)  # the file's, with a recipe fitted to the data where it writes none
    # a deployment's run starts here, not at `privpipe run`: the same checks before any run state exists
    # (the lock, the reservation, the MLflow run), so bad data fails it with one line, not mid-run; under
    # `privpipe run` they are the command's own, handed over, and the data is read once
    with _this_runs_checks(params) as checked:
        return _checked_run(params, params_file, checked)


def _checked_run(params: Params, params_file: str, checked: Preflight) -> RunResult:
    log = get_run_logger()
    if not params.privacy.secure_rng:
        log.warning(INSECURE_RNG_WARNING)
    # the stages that run in this thread (prepare, partition, head) included; each stage sets it again
    use_torch_threads(params, "pipeline")
    dataset = budget.dataset_name(params)
    clock = StageClock()
    with one_pipeline_at_a_time(), \
            budget.admitted(params, dataset, what="pipeline run", flow="pipeline") as admission, \
            tracking.tracked_run(params, params_file=params_file, flow="pipeline", dataset=dataset,
                                 exclusive=True) as run, \
            mapping_runner(params) as runner:
        log.info("pipeline: mapped tasks run on %s", describe_runner(params))
        result = _stages(params, run, runner, dataset, admission, clock, checked.ahead)
        ledger = result.evaluation.ledger()
        run.describe(result.headline(run_view.description(params, flow="pipeline", dataset=dataset,
                                                          params_file=params_file)))
        audit_tracking.log_audit_view(params, run, dataset=dataset, ledger=ledger, seconds=clock.seconds)
        markdown = privacy_markdown(ledger, result, mlflow_url=run.url())
        create_markdown_artifact(key="privacy-summary", markdown=markdown, description="privacy spend of this run")
    return RunResult(evaluation=result.evaluation, model=result.model, head=result.head,
                     data_version=result.data_version, lifetime=result.lifetime, run_id=run.run_id,
                     flow_run_id=str(flow_run.id), url_hint=run.url_hint())


def _prepare(params: Params, run: tracking.TrackedRun, runner: TaskRunner, admission: budget.Admission,
             ahead: PreparedAhead | None) -> PreparedSets:
    """The prepare stage, adopting the sets the checks prepared (``ahead``) when nothing they were made from
    changed since; where the checks wait for the schema the run discovers, they are made now."""
    with ExitStack() as stack:
        if ahead is None:  # the checks waited for the schema the run discovers (_checked_input)
            admission.mark_published()  # prepare's schema stage releases a schema computed from the records
            # the preflight's checks, which need that schema: a refusal now is charged; prepare adopts their sets
            ahead = stack.enter_context(checked_data(params))
        if partitioned_table(params):  # here, in the flow, so that each part is a mapped task where it is read
            prepared = run_prepare(params, map_parts=_mapped_parts(runner), ahead=ahead)
            prepared.log(run)
            return prepared
        return prepare_task(params, run, ahead)


def _stages(params: Params, run: tracking.TrackedRun, runner: TaskRunner, dataset: str,
            admission: budget.Admission, clock: StageClock, ahead: PreparedAhead | None) -> RunResult:
    with clock.timed("prepare"):
        prepared = _prepare(params, run, runner, admission, ahead)
    if params.student.enabled:
        with clock.timed("partition"):
            shards = partition_task(params, run, prepared)
    # Until the first output computed from the sensitive records is written or leaves for MLflow or Prefect's
    # logs, the run has released nothing, and a failure gives its reservation back (Admission.end).
    if params.dp_pca.enabled:
        # the noisy projection is computed from the sensitive records and kept on disk: from then on a run that
        # dies is charged its reservation, so that no output of the sensitive data is ever uncharged
        admission.mark_published()
    with clock.timed("dp_pca"):
        projection = dp_pca_task(params, run, prepared)
    if params.student.enabled:
        clear_partial_votes(prepared.where)
        with clock.timed("teachers"):
            vote_files = _teachers(params, runner, prepared, shards, projection)
            votes = collect_votes_task(params, run, prepared, projection, vote_files)
        admission.mark_published()  # the noisy votes' answers and their data-dependent analysis
        with clock.timed("aggregate"):
            labels = aggregate_task(params, run, votes, prepared, projection)
        with clock.timed("student"):
            student_task(params, run, labels, prepared, projection)
    else:  # switched-off stages replace their outputs with a note, as under dvc repro
        for skip in (run_partition, run_teachers, run_aggregate, run_student):
            skip(params)
    if params.finetune.enabled and params.finetune.mode == "federated":
        admission.mark_published()  # each round logs the test accuracy of the noisy model as it goes
        with clock.timed("finetune"):
            # the rounds run here, in the flow, so each round's client updates are mapped tasks
            deployed = run_finetune(params, where=prepared.where, updates_for=mapped_client_updates(runner))
            if not isinstance(deployed, Skipped):
                deployed.log(run, params)
    elif params.finetune.enabled:
        if uncovered.recorded(params):  # privacy.log_uncovered: each epoch's loss goes to the logs as it goes
            admission.mark_published()
        # finetune.recipe auto: the stage's time grows with the selection's secret number of runs
        with clock.timed("finetune", withheld=params.finetune.recipe == "auto"):
            # the stage's figures, once DP-SGD is done: a crash while training released nothing
            finetune_task(params, run, prepared, projection, before_release=admission.mark_published)
    else:
        run_finetune(params)
    model_dir = prepared.where.deployed(params)
    # the ledger is final: charge the dataset's lifetime budget before anything is released
    # (the evaluated model, then the head built on it)
    lifetime = audit_tracking.charge_run(params, run, flow="pipeline", dataset=dataset,
                                         ledger=Ledger.from_dict(read_json(model_dir / "ledger.json")),
                                         data_version=prepared.data_version, admission=admission)
    # evaluate first: its privacy audit must pass before any model, or anything built on it, is registered
    with clock.timed("evaluate"):
        evaluation = evaluate_task(params, run, prepared, model_dir)
    head = None
    if params.head.enabled:
        with clock.timed("head"):
            head = head_task(params, run, prepared, model_dir, projection)
    else:
        run_head(params)
    # the DP model is logged last: MLflow lists an experiment's logged models newest first, so it comes
    # before the head (not DP) there, as in a dvc repro run's record
    with clock.timed("evaluate"):
        model = release_task(params, run, evaluation)
    return RunResult(evaluation=evaluation, model=model, head=head, data_version=prepared.data_version,
                     lifetime=lifetime)
