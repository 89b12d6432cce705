"""MLflow recording: the client, one batched logger, runs, parameters, privacy spend, curves, the ledger.
(Releasing a model is :mod:`tasks.release`; each mechanism's own figures are in its ``tracking`` module.)

Everything goes through an explicit run id (MLflow's fluent API is thread-local,
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
from pathlib import Path
from typing import Any

import mlflow
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
from tasks.privacy import membership_audit, uncovered
from tasks.run_view import resolve_tracking_uri
from tasks.versioning import git_commit

__all__ = ["mlflow_client", "log_batch", "resolve_tracking_uri", "start_run", "finish_run", "tracked_run", "log_prepare",
           "log_privacy", "log_dp_pca", "log_finetune", "run_url_hint", "run_url", "log_figures", "log_curve",
           "describe_run", "name_by_data_version", "log_evaluation", "log_data_input", "log_stage_figures"]

# MLflow's limits per log_batch call
_MAX_METRICS, _MAX_PARAMS, _MAX_TAGS = 1000, 100, 100


def mlflow_client(params: Params) -> MlflowClient:
    """A client of the run.tracking_uri store (a relative SQLite path made absolute); also the fluent API's
    store, for ``mlflow.start_run`` around ``log_model``."""
    uri = resolve_tracking_uri(params.run.tracking_uri)
    mlflow.set_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri)


def log_batch(client: MlflowClient, run_id: str, *,
              metrics: Mapping[str, float] | Iterable[Metric | tuple[str, float, int]] = (),
              params: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None) -> None:
    """Log ``metrics`` (one point each from a mapping, else ``(key, value, step)`` or MLflow Metrics),
    ``params`` and ``tags`` in as few calls as MLflow's per-call limits allow; one timestamp for all."""
    stamp = int(time.time() * 1000)
    points = [(k, v, 0) for k, v in metrics.items()] if isinstance(metrics, Mapping) else metrics
    rows = [m if isinstance(m, Metric) else Metric(m[0], float(m[1]), stamp, int(m[2])) for m in points]
    params_ = [Param(k, str(v)) for k, v in (params or {}).items()]
    tags_ = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
    for i in range(0, len(rows), _MAX_METRICS):
        client.log_batch(run_id, metrics=rows[i:i + _MAX_METRICS])
    for i in range(0, len(params_), _MAX_PARAMS):
        client.log_batch(run_id, params=params_[i:i + _MAX_PARAMS])
    for i in range(0, len(tags_), _MAX_TAGS):
        client.log_batch(run_id, tags=tags_[i:i + _MAX_TAGS])


def log_dataset(client: MlflowClient, run_id: str, *, name: str, data_version: str, source: str) -> None:
    """The data the run trained on as an MLflow dataset input: its name, the data version as digest
    (DVC's md5; the full label, ``untracked:…`` included, as the input's ``dvc.data_version`` tag) and
    the file or folder it came from. Metadata only: no record goes to MLflow."""
    # MLflow builds its local-file source class at import time, under this name
    local = next(s for s in get_registered_sources() if s.__name__ == "LocalArtifactDatasetSource")
    base, withheld = run_view.file_version(data_version)
    digest = base.rpartition(":")[2][:run_view.DIGEST_LENGTH - 9 if withheld else run_view.DIGEST_LENGTH]
    if withheld:  # the same file less other records is other data: the digest must differ
        digest += "-" + hashlib.md5(withheld.encode()).hexdigest()[:8]
    dataset = MetaDataset(local(str(Path(source).resolve())), name=name, digest=digest)
    client.log_inputs(run_id, datasets=[DatasetInput(dataset._to_mlflow_entity(), tags=[
        InputTag("mlflow.data.context", "training"), InputTag("dvc.data_version", data_version)])])


def link_prefect_flow_run(params: Params, client: MlflowClient, run_id: str, experiment_id: str) -> None:
    """Both ways: the MLflow run tagged with the Prefect flow run, the flow run given a link artifact
    to the MLflow run (shown under the flow run's Artifacts in Prefect)."""
    tags = run_view.prefect_links()
    if not tags:
        return
    log_batch(client, run_id, tags=tags)
    create_link_artifact(link=run_view.run_url(params, experiment_id, run_id), link_text=f"MLflow run {run_id}",
                         key="mlflow-run", description="this flow run's MLflow run (`make ui` serves a local store)")


def log_figures(client: MlflowClient, run_id: str, values: dict[str, float]) -> None:
    """One-point figures: ε, accuracy and AUC figures as metrics (full precision), the rest as tags
    (``run_view.format_value``), so the run's charts are the ones that say something."""
    metrics = {k: v for k, v in values.items() if run_view.chart_worthy(k)}
    tags = {k: run_view.format_value(v) for k, v in values.items() if k not in metrics}
    log_batch(client, run_id, metrics=metrics, tags=tags)


def experiment_id(params: Params) -> str:
    """The run.experiment's id, created on first use (artifacts beside mlflow.db for a local store;
    a tracking server keeps them where it was told to)."""
    client = mlflow_client(params)
    experiment = client.get_experiment_by_name(params.run.experiment)
    if experiment is not None:
        return experiment.experiment_id
    local = not resolve_tracking_uri(params.run.tracking_uri).startswith(("http://", "https://"))
    artifacts = Path("mlartifacts").resolve().as_uri() if local else None
    return client.create_experiment(params.run.experiment, artifact_location=artifacts)


def start_run(params: Params, *, run_name: str | None = None, params_file: str = "params.yaml",
              tags: dict[str, str] | None = None) -> str:
    """Create the run (experiment on first use), log every parameter, the source and its git commit."""
    client = mlflow_client(params)
    tags = tags or {}
    run = client.create_run(experiment_id(params), run_name=run_name, tags={
        **run_view.source_tags(tags.get("privpipe.flow", ""), git_commit()), "privpipe.version": privpipe.__version__,
        "privpipe.params_file": params_file, "privpipe.project": project_id(), **tags,
    })
    log_batch(client, run.info.run_id, params=dict(sorted(params.flat().items())))
    return run.info.run_id


def finish_run(params: Params, run_id: str, *, status: str = "FINISHED") -> None:
    mlflow_client(params).set_terminated(run_id, status)


def project_id() -> str:
    """This project folder on this machine, as a tag: a hash of host name and path (a shared tracking
    server holds many projects, and containers often share a path such as /app)."""
    where = f"{socket.gethostname()}:{Path.cwd().resolve()}"
    return hashlib.sha256(where.encode()).hexdigest()[:16]


def close_abandoned_runs(params: Params, *, flow: str) -> list[str]:
    """Mark this project's runs of ``flow`` still RUNNING as KILLED; their ids.

    Only for a caller holding the flow's project lock: then no other run of the flow is alive,
    and a RUNNING one is a process that died (SIGKILL, power loss) before it could say so."""
    client = mlflow_client(params)
    abandoned = client.search_runs(
        [experiment_id(params)], filter_string=f"attributes.status = 'RUNNING' and tags.`privpipe.flow` = '{flow}' "
                                               f"and tags.`privpipe.project` = '{project_id()}'")
    for run in abandoned:
        client.set_tag(run.info.run_id, "privpipe.ended", "killed: its process died before the run finished; "
                                                          "marked by the next run of the flow")
        client.set_terminated(run.info.run_id, "KILLED")
    return [run.info.run_id for run in abandoned]


@contextmanager
def tracked_run(params: Params, *, params_file: str, flow: str, dataset: str, run_name: str | None = None,
                exclusive: bool = False) -> Iterator[str]:
    """``with tracked_run(...) as run_id:`` — a started run, FINISHED when the block ends, FAILED if it raises.

    Tagged ``privpipe.flow`` and ``privpipe.dataset``: what ``privpipe audit`` selects by. Named
    ``<flow> · <dataset>`` unless ``run_name`` is given (:func:`name_by_data_version` adds the data
    version once known), described in one line, tagged with torch's thread counts and, inside a
    Prefect flow run, linked with it both ways.
    ``exclusive``: the caller holds the flow's project lock, so runs of the flow left RUNNING
    by a dead process are closed first (:func:`close_abandoned_runs`)."""
    if exclusive:
        close_abandoned_runs(params, flow=flow)
    run_id = start_run(params, run_name=run_name or run_view.run_name(flow, dataset), params_file=params_file,
                       tags={"privpipe.flow": flow, "privpipe.dataset": dataset,
                             "mlflow.note.content": run_view.description(params, flow=flow, dataset=dataset,
                                                                         params_file=params_file),
                             "privpipe.torch_threads": f"{stage_threads(params)} per stage, "
                                                       f"{task_threads(params)} per parallel task"})
    link_prefect_flow_run(params, mlflow_client(params), run_id, experiment_id(params))
    try:
        yield run_id
    except BaseException:
        finish_run(params, run_id, status="FAILED")
        raise
    finish_run(params, run_id)


def run_url(params: Params, run_id: str) -> str:
    """The run's page in the MLflow UI, on the training-runs view."""
    return run_view.run_url(params, mlflow_client(params).get_run(run_id).info.experiment_id, run_id)


def run_url_hint(params: Params, run_id: str) -> str:
    """How to open the run: the ``mlflow ui`` command for a local store, then the run's address."""
    uri = resolve_tracking_uri(params.run.tracking_uri)
    if uri.startswith(("http://", "https://")):
        return run_url(params, run_id)
    return f"mlflow ui --backend-store-uri {redact_url(uri)}  →  {run_url(params, run_id)}"


def describe_run(params: Params, run_id: str, text: str) -> None:
    """Replace the run's one-line description (``mlflow.note.content``, shown under its name)."""
    mlflow_client(params).set_tag(run_id, "mlflow.note.content", text)


def name_by_data_version(params: Params, run_id: str, data_version: str) -> None:
    """``<flow> · <dataset> · <short data version>``, once the data version is known."""
    client = mlflow_client(params)
    tags = client.get_run(run_id).data.tags
    client.update_run(run_id, name=run_view.run_name(tags.get("privpipe.flow", "run"),
                                                     tags.get("privpipe.dataset", "data"), data_version))


def log_data_input(params: Params, run_id: str, *, data_version: str, source: str) -> None:
    """The data version as the run's tag (``dvc.data_version``), its dataset input and its name."""
    client = mlflow_client(params)
    client.set_tag(run_id, "dvc.data_version", data_version)
    dataset = client.get_run(run_id).data.tags.get("privpipe.dataset", Path(source).stem)
    log_dataset(client, run_id, name=dataset, data_version=data_version, source=source)
    name_by_data_version(params, run_id, data_version)


def log_prepare(params: Params, run_id: str, out: dict[str, str]) -> None:
    log_data_input(params, run_id, data_version=out["data_version"], source=params.prepare.path)
    log_figures(mlflow_client(params), run_id, {f"data.{k}": float(v) for k, v in out.items() if k.startswith("n_")})


def log_stage_figures(params: Params, run_id: str, stage: str, out: dict[str, Any]) -> None:
    """Every numeric figure a stage returned as ``<stage>.<name>`` (:func:`log_figures`); strings as tags."""
    client = mlflow_client(params)
    numbers = {f"{stage}.{k}": float(v) for k, v in out.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    log_figures(client, run_id, numbers)
    for key, value in out.items():
        if isinstance(value, bool):
            client.set_tag(run_id, f"{stage}.{key}", str(value).lower())
        elif isinstance(value, str) and key not in ("dir", "ledger", "votes", "model_dir"):
            client.set_tag(run_id, f"{stage}.{key}", value)


def log_curve(params: Params, run_id: str, key: str, points: list[tuple[int, float]]) -> None:
    """A metric over steps (MLflow draws it as a curve)."""
    log_batch(mlflow_client(params), run_id, metrics=[(key, value, step) for step, value in points])


def log_privacy(params: Params, run_id: str, ledger: Ledger) -> None:
    """Total (ε, δ) and each stage's ε as metrics, each stage's δ and the accountant as tags, the ledger
    as an artifact (the budget is the parameter ``privacy.epsilon_budget``)."""
    client = mlflow_client(params)
    summary = ledger.summary()
    values = {"privacy.epsilon": summary["total"]["epsilon"], "privacy.delta": summary["total"]["delta"]}
    for stage, spend in summary["stages"].items():
        values[f"privacy.{stage}.epsilon"] = spend["epsilon"]
        values[f"privacy.{stage}.delta"] = spend["delta"]
    log_figures(client, run_id, values)
    client.set_tag(run_id, "privacy.accountant", summary["total"]["accountant"])
    client.log_text(run_id, ledger.to_json(), "privacy/ledger.json")


def log_dp_pca(params: Params, run_id: str, out: dict[str, Any], ledger: Ledger) -> None:
    if out.get("noise_multiplier") is not None:
        log_figures(mlflow_client(params), run_id, {"dp_pca.noise_multiplier": out["noise_multiplier"]})
    log_privacy(params, run_id, ledger)


def log_finetune(params: Params, run_id: str, out: dict[str, Any], ledger: Ledger,
                 history: list[dict[str, float]], curve: list[dict[str, float]]) -> None:
    client = mlflow_client(params)
    metrics = [("finetune.loss", h["loss"], h["step"]) for h in history] if uncovered.recorded(params) else []
    metrics += [("finetune.learning_rate", h["lr"], h["step"]) for h in history]
    metrics += [("privacy.finetune.epsilon_by_step", c["epsilon"], c["step"]) for c in curve]
    log_batch(client, run_id, metrics=metrics)
    log_figures(client, run_id, {f"finetune.{k}": out[k] for k in ("noise_multiplier", "sample_rate", "steps")})
    log_privacy(params, run_id, ledger)


def log_evaluation(params: Params, run_id: str, out: dict[str, Any]) -> None:
    """Accuracy metrics, the membership audit's figures (:mod:`tasks.privacy.uncovered`: only when the
    user asks), and what ε does not cover."""
    client = mlflow_client(params)
    shown = uncovered.without(params, out)
    log_batch(client, run_id, metrics={f"accuracy.{k.removeprefix('accuracy_')}": v for k, v in shown.items()
                                       if k.startswith("accuracy_")})
    client.set_tag(run_id, "privacy.not_covered", uncovered.note(params))
    audit = out.get("privacy_audit", {})
    if membership_audit.metric_items(audit):  # the empirical lower bound and the attacks' AUC, next to the claimed ε
        client.set_tag(run_id, "privacy.audit", membership_audit.AUDIT_TAG)
        if uncovered.recorded(params):
            log_figures(client, run_id, membership_audit.metric_items(audit))
