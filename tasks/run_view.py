"""How a run reads in the MLflow UI: its name and one-line description, its source (the git commit),
its address, the tags that link it to its Prefect flow run, and which figures are shown as tags
where a one-point chart would say nothing. Pure text: :mod:`tasks.tracking` writes it.

MLflow 3 opens an experiment on its GenAI screens unless the address says otherwise: the UI is a
hash router, so the query goes after the route, ``#/experiments/1/runs/<id>?workflowType=machine_learning``
(read by the UI's workflow-type provider; the ``mlflow.experimentKind`` tag alone did not switch it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefect.context import FlowRunContext
from prefect.settings import PREFECT_UI_URL

from privpipe.config import Params, redact_url

__all__ = ["LOCAL_UI", "format_value", "short_version", "run_name", "source_tags",
           "description", "prefect_links", "chart_worthy", "resolve_tracking_uri",
           "headline", "ui_base", "WORKFLOW"]

#: what ``make ui`` (``mlflow ui``) serves for a local store
LOCAL_UI = "http://127.0.0.1:5000"
#: the training-runs view (MLflow 3.17's UI otherwise opens the GenAI screens)
WORKFLOW = "workflowType=machine_learning"
#: the command each flow's run comes from (MLflow's Source column)
SOURCES = {"pipeline": "privpipe run", "federated-text": "privpipe federated", "removals": "privpipe removals",
           "dvc-repro": "privpipe stage evaluate --track"}
DIGEST_LENGTH = 36  # MLflow's limit on a dataset digest


def format_value(value: float) -> str:
    """A figure as a tag shows it: integers whole, others to 6 significant digits."""
    number = float(value)
    return str(int(number)) if number.is_integer() and abs(number) < 1e15 else f"{number:.6g}"


def chart_worthy(key: str) -> bool:
    """Whether a one-point figure stays a metric: ε and accuracy figures and the attacks' AUCs are what
    ``privpipe audit``, the accuracy-vs-ε plot and MLflow's run comparison read; counts, budgets,
    noise multipliers and other settings go to tags."""
    last = key.rsplit(".", 1)[-1]
    return ("accuracy" in key or last.startswith("epsilon") or last.endswith("epsilon") or last == "auc"
            or key == "privacy.delta")


def file_version(data_version: str) -> tuple[str, str]:
    """(the file's version, what prepare took out of it: ``+minus-…`` or "")."""
    base, plus, withheld = data_version.partition("+")
    return base, plus + withheld


def short_version(data_version: str) -> str:
    """``48e0e995`` for DVC's md5, ``untracked:9f3c2a1b`` for files outside DVC; a ``+minus-…`` suffix kept."""
    base, withheld = file_version(data_version)
    kind, _, digest = base.rpartition(":")
    return (f"{kind}:{digest[:8]}" if kind else digest[:8]) + withheld


def run_name(flow: str, dataset: str, data_version: str | None = None) -> str:
    return " · ".join([flow, dataset] + ([short_version(data_version)] if data_version else []))


def resolve_tracking_uri(uri: str, root: Path = Path(".")) -> str:
    """Make a relative ``sqlite:///file.db`` absolute (``sqlite:////abs/file.db``) against ``root``."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str((root / uri[len(prefix):]).resolve())
    return uri


def ui_base(params: Params) -> str:
    """Where the MLflow UI of ``run.tracking_uri`` is: a tracking server's own address, else ``make ui``'s."""
    uri = resolve_tracking_uri(params.run.tracking_uri)
    return str(redact_url(uri)).rstrip("/") if uri.startswith(("http://", "https://")) else LOCAL_UI


def source_tags(flow: str, commit: str) -> dict[str, str]:
    """MLflow's Source column: the command and the git commit (``+dirty`` when tracked files differ)."""
    return {"mlflow.source.type": "LOCAL", "mlflow.source.name": SOURCES.get(flow, f"privpipe {flow}"),
            "mlflow.source.git.commit": commit}


def description(params: Params, *, flow: str, dataset: str, params_file: str) -> str:
    """The run's one line (``mlflow.note.content``) at its start; the flow may replace it with its result."""
    if flow in ("pipeline", "dvc-repro"):
        stages = ["DP-PCA" if params.dp_pca.enabled else None, "PATE teachers → student" if params.student.enabled
                  else None, f"DP finetune ({params.finetune.mode})" if params.finetune.enabled else None,
                  "removal head" if params.head.enabled else None]
        what = "training pipeline: " + " → ".join(s for s in stages if s)
        if flow == "dvc-repro":
            what += ", recorded from dvc repro's outputs"
    elif flow == "federated-text":
        if not params.federated.private:
            return (f"federated text classification ({params.text.mode} encoder, FedAvg over "
                    f"{params.federated.rounds} rounds, NOT differentially private) on {dataset}, {params_file}")
        what = (f"federated text classification ({params.text.mode} encoder, DP-FedAvg over "
                f"{params.federated.rounds} rounds)")
    else:  # e.g. removals: their runs describe themselves
        return f"privpipe {flow} on {dataset}, {params_file}"
    return f"{what} on {dataset}, {params_file}, privacy budget ε ≤ {params.privacy.epsilon_budget:g}"


def prefect_links() -> dict[str, str]:
    """Tags naming the Prefect flow run this code runs in (nothing outside a flow run)."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return {}
    tags = {"prefect.flow_run_id": str(context.flow_run.id), "prefect.flow_run_name": context.flow_run.name}
    if PREFECT_UI_URL.value():  # a Prefect server with a UI (`privpipe serve`; the temporary one has none)
        tags["prefect.flow_run_url"] = f"{PREFECT_UI_URL.value().rstrip('/')}/flow-runs/flow-run/{context.flow_run.id}"
    return tags


def headline(prefix: str, *, accuracy_test: float | None = None, epsilon: float | None = None,
             delta: float | None = None, record_epsilon: float | None = None, models: Sequence[str] = ()) -> str:
    """A finished run's one line: ``prefix`` (what it was), then test accuracy, ε and the registered models
    (each as ``model NAME/VERSION``, or as its caller words it)."""
    parts = []
    if accuracy_test is not None:
        parts.append(f"test accuracy {accuracy_test:.4f}")
    if record_epsilon is not None:  # a federated text run: client-level, and for one record
        parts.append(f"client-level ε = {epsilon:.4g} (δ = {delta:g}), one record's ε = {record_epsilon:.4g}")
    elif epsilon is not None:
        parts.append(f"ε = {epsilon:.4g} (δ = {delta:g})")
    parts += models
    return f"{prefix}: {', '.join(parts)}" if parts else prefix
