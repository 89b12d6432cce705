"""MLflow recording: one handle per run (client, run id, experiment), opened by :func:`tracked_run`
and passed down to every task that records. (Releasing a model is :mod:`tasks.release`; each stage's
figures are logged by its own output's ``log`` method.)

Everything goes through the handle's explicit run id (MLflow's fluent API is thread-local,
and Prefect may run tasks on other threads). Metric names an auditor looks for:

- ``privacy.epsilon`` / ``privacy.delta``: the run's total, by the ledger's accountant
- ``privacy.<stage>.epsilon``: each stage alone (its δ is the tag ``privacy.<stage>.delta``)
- ``privacy.finetune.epsilon_by_step``: the stage's ε as DP-SGD went on (a curve)
- ``accuracy.test`` (and ``accuracy.train``, ``finetune.loss``: ε does not cover them, so only with
  ``privacy.log_uncovered``; :mod:`tasks.privacy.uncovered`)

One-point figures that a chart would not explain (counts, noise multipliers, budgets) are tags,
6 significant digits (:func:`tasks.run_view.chart_worthy`); curves and ε/accuracy figures are metrics.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from matplotlib.figure import Figure
from mlflow.data.dataset_source_registry import get_registered_sources
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from prefect.artifacts import create_link_artifact

import privpipe
from privpipe.config import Params, redact_url
from privpipe.privacy import Ledger
from tasks import run_view
from tasks.common import stage_threads, task_threads
from tasks.registered import ensure_model_of
from tasks.run_view import resolve_tracking_uri
from tasks.versioning import git_commit

__all__ = ["TrackedRun", "open_store", "tracked_run", "start_run", "experiment_id", "resolve_tracking_uri",
           "ensure_models_of", "store_made"]

# MLflow's limits per log_batch call: of each kind, and of all three together
_MAX_METRICS, _MAX_PARAMS, _MAX_TAGS, _MAX_ENTITIES = 1000, 100, 100, 1000
#: keys of a stage's figures that name its files: not tags
_PATH_KEYS = ("dir", "ledger", "votes", "model_dir")


def open_store(params: Params) -> MlflowClient:
    """A client of the run.tracking_uri store (a relative SQLite path made absolute). It also points the
    fluent API at the store, for ``mlflow.start_run`` around ``log_model`` and ``register_model``: done
    once per command, where the command opens its run (or, without one, its store)."""
    uri = resolve_tracking_uri(params.run.tracking_uri)
    mlflow.set_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri)


def store_made(params: Params) -> bool:
    """False for a SQLite store not made yet (it holds nothing, and opening a client would make it); True
    otherwise (a tracking server's store is never made by a read)."""
    uri = resolve_tracking_uri(params.run.tracking_uri)
    return not uri.startswith("sqlite:///") or Path(uri.removeprefix("sqlite:///")).is_file()


def ensure_models_of(params: Params, dataset: str, names: dict[str, str]) -> None:
    """Before any work: each registered model of ``names`` (name → the params key naming it) holds no other
    dataset's versions (ConfigError in one line). A SQLite store not made yet holds none, and is not made."""
    if not params.evaluate.register_model or not store_made(params):
        return
    client = MlflowClient(tracking_uri=resolve_tracking_uri(params.run.tracking_uri))
    for name, key in names.items():
        ensure_model_of(client, name, dataset, key=key)


@dataclass(frozen=True)
class TrackedRun:
    """One open MLflow run: what every recording task is handed (never rebuilt from params)."""

    client: MlflowClient
    run_id: str
    experiment_id: str
    tracking_uri: str  # resolved: an absolute SQLite path, or a server's address
    ui_base: str  # the tracking server's own address, else what ``make ui`` serves

    # -- logging ------------------------------------------------------------------------------

    def log_batch(self, *, metrics: Mapping[str, float] | Iterable[Metric | tuple[str, float, int]] = (),
                  params: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None) -> None:
        """Log ``metrics`` (one point each from a mapping, else ``(key, value, step)`` or MLflow Metrics),
        ``params`` and ``tags`` in as few calls as MLflow's per-call limits allow; one timestamp for all."""
        log_batch(self.client, self.run_id, metrics=metrics, params=params, tags=tags)

    def log_figures(self, values: Mapping[str, float], *, tags: Mapping[str, str] | None = None) -> None:
        """One-point figures: ε, accuracy and AUC figures as metrics (full precision), the rest as tags
        (``run_view.format_value``), so the run's charts are the ones that say something; ``tags`` (text)
        beside them, in the same calls."""
        metrics = {k: v for k, v in values.items() if run_view.chart_worthy(k)}
        texts = {k: run_view.format_value(v) for k, v in values.items() if k not in metrics}
        self.log_batch(metrics=metrics, tags={**texts, **(tags or {})})

    def log_stage_figures(self, stage: str, figures: Mapping[str, Any]) -> None:
        """Every numeric figure of a stage as ``<stage>.<name>`` (:meth:`log_figures`); booleans and strings
        as tags (file paths left out)."""
        numbers = {f"{stage}.{k}": float(v) for k, v in figures.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        texts = {f"{stage}.{k}": str(v).lower() if isinstance(v, bool) else v for k, v in figures.items()
                 if isinstance(v, bool) or (isinstance(v, str) and k not in _PATH_KEYS)}
        self.log_figures(numbers, tags=texts)

    def log_curve(self, key: str, points: Iterable[tuple[int, float]]) -> None:
        """A metric over steps (MLflow draws it as a curve)."""
        self.log_batch(metrics=[(key, value, step) for step, value in points])

    def log_privacy(self, ledger: Ledger) -> None:
        """Total (ε, δ) and each stage's ε as metrics, each stage's δ and the accountant as tags, the ledger
        as an artifact (the budget is the parameter ``privacy.epsilon_budget``)."""
        summary = ledger.summary()
        values = {"privacy.epsilon": summary["total"]["epsilon"], "privacy.delta": summary["total"]["delta"]}
        for stage, spend in summary["stages"].items():
            values[f"privacy.{stage}.epsilon"] = spend["epsilon"]
            values[f"privacy.{stage}.delta"] = spend["delta"]
        self.log_figures(values, tags={"privacy.accountant": summary["total"]["accountant"]})
        self.log_text(ledger.to_json(), "privacy/ledger.json")

    def log_data_input(self, *, data_version: str, source: str) -> None:
        """The data version as the run's tag (``dvc.data_version``), its dataset input, and the run's name
        (``<flow> · <dataset> · <short data version>``)."""
        self.set_tag("dvc.data_version", data_version)
        tags = self.tags()
        dataset = tags.get("privpipe.dataset", Path(source).stem)
        log_dataset(self.client, self.run_id, name=dataset, data_version=data_version, source=source)
        self.client.update_run(self.run_id, name=run_view.run_name(tags.get("privpipe.flow", "run"),
                                                                     tags.get("privpipe.dataset", "data"),
                                                                     data_version))

    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.log_batch(tags=tags)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_figure(self, figure: Figure, artifact_file: str) -> None:
        self.client.log_figure(self.run_id, figure, artifact_file)

    def describe(self, text: str) -> None:
        """Replace the run's one-line description (``mlflow.note.content``, shown under its name)."""
        self.set_tag("mlflow.note.content", text)

    # -- reading --------------------------------------------------------------------------------

    def tags(self) -> dict[str, str]:
        return dict(self.client.get_run(self.run_id).data.tags)

    def url(self) -> str:
        """The run's page in the MLflow UI, on the training-runs view."""
        return f"{self.ui_base}/#/experiments/{self.experiment_id}/runs/{self.run_id}?{run_view.WORKFLOW}"

    def url_hint(self) -> str:
        """How to open the run: the ``mlflow ui`` command for a local store, then the run's address."""
        if self.tracking_uri.startswith(("http://", "https://")):
            return self.url()
        return f"mlflow ui --backend-store-uri {redact_url(self.tracking_uri)}  →  {self.url()}"

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status)


def log_batch(client: MlflowClient, run_id: str, *,
              metrics: Mapping[str, float] | Iterable[Metric | tuple[str, float, int]] = (),
              params: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None) -> None:
    """:meth:`TrackedRun.log_batch` for a run the caller only has the id of (a per-stage child run)."""
    stamp = int(time.time() * 1000)
    points = [(k, v, 0) for k, v in metrics.items()] if isinstance(metrics, Mapping) else metrics
    rows = [m if isinstance(m, Metric) else Metric(m[0], float(m[1]), stamp, int(m[2])) for m in points]
    params_ = [Param(k, str(v)) for k, v in (params or {}).items()]
    tags_ = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
    # all three kinds in each call (each call is a store transaction), as many as MLflow takes per call
    while rows or params_ or tags_:
        some_params, params_ = params_[:_MAX_PARAMS], params_[_MAX_PARAMS:]
        some_tags, tags_ = tags_[:_MAX_TAGS], tags_[_MAX_TAGS:]
        room = _MAX_ENTITIES - len(some_params) - len(some_tags)
        some_rows, rows = rows[:room], rows[room:]
        client.log_batch(run_id, metrics=some_rows, params=some_params, tags=some_tags)


def log_dataset(client: MlflowClient, run_id: str, *, name: str, data_version: str, source: str) -> None:
    """The data the run trained on as an MLflow dataset input: its name, the data version as digest
    (DVC's md5; the full label, ``untracked:…`` included, as the input's ``dvc.data_version`` tag) and
    the file or folder it came from. Metadata only: no record goes to MLflow."""
    # MLflow builds its local-file source class at import time, under this name
    local: Any = next(s for s in get_registered_sources()
                      if getattr(s, "__name__", "") == "LocalArtifactDatasetSource")
    base, withheld = run_view.file_version(data_version)
    digest = base.rpartition(":")[2][:run_view.DIGEST_LENGTH - 9 if withheld else run_view.DIGEST_LENGTH]
    if withheld:  # the same file less other records is other data: the digest must differ
        digest += "-" + hashlib.md5(withheld.encode()).hexdigest()[:8]
    # MetaDataset's profile is abstract in MLflow's stub, implemented at run time
    dataset = MetaDataset(local(str(Path(source).resolve())), name=name, digest=digest)  # type: ignore[abstract]
    client.log_inputs(run_id, datasets=[DatasetInput(dataset._to_mlflow_entity(), tags=[
        InputTag("mlflow.data.context", "training"), InputTag("dvc.data_version", data_version)])])


def experiment_id(client: MlflowClient, params: Params) -> str:
    """The run.experiment's id, created on first use (artifacts beside mlflow.db for a local store;
    a tracking server keeps them where it was told to)."""
    experiment = client.get_experiment_by_name(params.run.experiment)
    if experiment is not None:
        return str(experiment.experiment_id)
    local = not resolve_tracking_uri(params.run.tracking_uri).startswith(("http://", "https://"))
    artifacts = Path("mlartifacts").resolve().as_uri() if local else None
    return str(client.create_experiment(params.run.experiment, artifact_location=artifacts))


def start_run(params: Params, *, run_name: str | None = None, params_file: str = "params.yaml",
              tags: dict[str, str] | None = None) -> TrackedRun:
    """Create the run (experiment on first use), log every parameter, the source and its git commit."""
    client = open_store(params)
    tags = tags or {}
    experiment = experiment_id(client, params)
    created = client.create_run(experiment, run_name=run_name, tags={
        **run_view.source_tags(tags.get("privpipe.flow", ""), git_commit()), "privpipe.version": privpipe.__version__,
        "privpipe.params_file": params_file, "privpipe.project": project_id(), **tags,
    })
    run = TrackedRun(client=client, run_id=created.info.run_id, experiment_id=experiment,
                     tracking_uri=resolve_tracking_uri(params.run.tracking_uri), ui_base=run_view.ui_base(params))
    run.log_batch(params=dict(sorted(params.flat().items())))
    return run


def project_id() -> str:
    """This project folder on this machine, as a tag: a hash of host name and path (a shared tracking
    server holds many projects, and containers often share a path such as /app)."""
    where = f"{socket.gethostname()}:{Path.cwd().resolve()}"
    return hashlib.sha256(where.encode()).hexdigest()[:16]


def close_abandoned_runs(client: MlflowClient, experiment: str, *, flow: str) -> list[str]:
    """Mark this project's runs of ``flow`` still RUNNING as KILLED; their ids.

    Only for a caller holding the flow's project lock: then no other run of the flow is alive,
    and a RUNNING one is a process that died (SIGKILL, power loss) before it could say so."""
    abandoned = client.search_runs(
        [experiment], filter_string=f"attributes.status = 'RUNNING' and tags.`privpipe.flow` = '{flow}' "
                                    f"and tags.`privpipe.project` = '{project_id()}'")
    for run in abandoned:
        client.set_tag(run.info.run_id, "privpipe.ended", "killed: its process died before the run finished; "
                                                          "marked by the next run of the flow")
        client.set_terminated(run.info.run_id, "KILLED")
    return [run.info.run_id for run in abandoned]


def _link_prefect_flow_run(run: TrackedRun) -> None:
    """Both ways: the MLflow run tagged with the Prefect flow run, the flow run given a link artifact
    to the MLflow run (shown under the flow run's Artifacts in Prefect)."""
    tags = run_view.prefect_links()
    if not tags:
        return
    run.set_tags(tags)
    create_link_artifact(link=run.url(), link_text=f"MLflow run {run.run_id}",
                         key="mlflow-run", description="this flow run's MLflow run (`make ui` serves a local store)")


@contextmanager
def tracked_run(params: Params, *, params_file: str, flow: str, dataset: str, run_name: str | None = None,
                exclusive: bool = False) -> Iterator[TrackedRun]:
    """``with tracked_run(...) as run:`` — a started run, FINISHED when the block ends, FAILED if it raises.

    Tagged ``privpipe.flow`` and ``privpipe.dataset``: what ``privpipe audit`` selects by. Named
    ``<flow> · <dataset>`` unless ``run_name`` is given (:meth:`TrackedRun.log_data_input` adds the data
    version once known), described in one line, tagged with torch's thread counts and, inside a
    Prefect flow run, linked with it both ways.
    ``exclusive``: the caller holds the flow's project lock, so runs of the flow left RUNNING
    by a dead process are closed first (:func:`close_abandoned_runs`)."""
    if exclusive:
        client = open_store(params)
        close_abandoned_runs(client, experiment_id(client, params), flow=flow)
    run = start_run(params, run_name=run_name or run_view.run_name(flow, dataset), params_file=params_file,
                    tags={"privpipe.flow": flow, "privpipe.dataset": dataset,
                          "mlflow.note.content": run_view.description(params, flow=flow, dataset=dataset,
                                                                      params_file=params_file),
                          "privpipe.torch_threads": f"{stage_threads(params)} per stage, "
                                                    f"{task_threads(params)} per parallel task"})
    _link_prefect_flow_run(run)
    try:
        yield run
    except BaseException:
        run.finish("FAILED")
        raise
    run.finish()
