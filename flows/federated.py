"""Federated text classification with client-level DP, as a Prefect flow:
prepare text → clients → encode → DP-FedAvg (client updates as mapped tasks) → evaluate → MLflow.

    privpipe federated [--params params.yaml]

Knobs: the ``text`` section (data, encoder, frozen or LoRA) and the ``federated`` section
(clients, sampling, rounds, clipping, noise or target ε, server optimiser). One MLflow run:
per-round test accuracy and ε as curves, clients per round, the ledger, and the model
(text in, label out) registered as ``text.model_name`` with its privacy tags. Like the
pipeline, it reserves its most on its dataset's lifetime budget before any work, and once its
rounds are planned holds their record-level cost instead (one record changes one client: a
group of two), refused before its rounds if the dataset cannot pay that beside what other runs
hold; its charge replaces the reservation (``privpipe budget``). A non-private run
(``federated.private: false``) has no finite ε and is refused. One text run at a time per project.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from flows.client_map import mapped_client_updates
from flows.pipeline import INSECURE_RNG_WARNING
from flows.runner import describe_runner, mapping_runner
from privpipe.config import Params, load_params
from privpipe.privacy import Event, Ledger
from tasks import paths, run_view, tracking
from tasks.common import one_at_a_time, read_json, use_torch_threads
from tasks.privacy import budget
from tasks.privacy import tracking as audit_tracking
from tasks.text import tracking as text_tracking
from tasks.text.features import text_features_task
from tasks.text.prepare import prepare_text_task
from tasks.text.train import record_ledger, run_federated_text

__all__ = ["federated_text", "federated_markdown"]


def federated_markdown(out: dict[str, Any]) -> str:
    lines = ["# privpipe federated text run", "",
             f"Test accuracy **{out['accuracy_test']:.4f}** after {out['rounds']} of {out['rounds_planned']} rounds, "
             f"K = {out['clients']} clients, {out['sampling']} sampling at q = {out['sample_rate']:g}."]
    if out["private"]:
        lines.append(f"Client-level privacy: **ε = {out['epsilon']:.4f}**, δ = {out['delta']:g} "
                     f"({out['accountant'].upper()} accountant; noise z = {out['noise_multiplier']:.4g}, "
                     f"clip S = {out['clip_norm']:g}). For one record (two add-or-remove steps of one client): "
                     f"ε = {out['record_epsilon']:.4f} ({out['record_accountant'].upper()}), what the dataset's "
                     "lifetime budget is charged.")
    else:
        lines.append("Not private (federated.private: false): no clipping, no noise, no guarantee.")
    if out.get("stopped"):
        lines.append(out["stopped"])
    return "\n".join(lines)


@flow(name="privpipe-federated-text")
def federated_text(params_file: str = "params.yaml") -> dict[str, Any]:
    params = load_params(params_file)
    log = get_run_logger()
    if not params.privacy.secure_rng:
        log.warning(INSECURE_RNG_WARNING)
    use_torch_threads(params, "federated")  # each stage sets it again; client updates set their own
    dataset = budget.dataset_name(params, flow="federated-text")
    with one_at_a_time(paths.TEXT_LOCK, what="another federated text run"), \
            budget.admitted(params, dataset, what="federated text run", flow="federated-text",
                            private=params.federated.private,
                            client_level=params.federated.noise == "server") as admission:
        return _run(params, params_file, dataset, log, admission)


def _run(params: Params, params_file: str, dataset: str, log: logging.LoggerAdapter,
         admission: budget.Admission) -> dict[str, Any]:
    client_noise = params.federated.noise == "client"
    with tracking.tracked_run(params, params_file=params_file, flow="federated-text",
                              dataset=dataset) as run_id, mapping_runner(params) as runner:
        log.info("federated: client updates run on %s", describe_runner(params))
        prepared = prepare_text_task(params, run_id)
        features = text_features_task(params, run_id, prepared["dir"])

        def lifetime_can_pay(planned: Event) -> None:
            # hold the planned rounds' record-level cost instead of the client-level floor, then start
            epsilon, delta, basis = budget.planned_cost(params, planned, record_level=client_noise)
            admission.resize(epsilon=epsilon, delta=delta, basis=basis, before="its first round")
            admission.mark_published()  # the rounds log their curves as they go

        out = run_federated_text(params, text_dir=prepared["dir"], features_dir=features["dir"],
                                 updates_for=mapped_client_updates(runner), before_rounds=lifetime_can_pay)
        text_tracking.log_federated(params, run_id, out)
        ledger = Ledger.from_dict(read_json(out["ledger"]))
        # the lifetime ledger composes records: charge the record-level form, before the model is released
        audit_tracking.charge_run(params, run_id, flow="federated-text", dataset=dataset,
                                  ledger=record_ledger(params, ledger), data_version=prepared["data_version"],
                                  admission=admission)
        out.update(text_tracking.register_text_model(params, run_id, out, features["encoder"]))
        audit_tracking.log_audit_view(params, run_id, dataset=dataset, ledger=ledger)
        tracking.describe_run(params, run_id, run_view.headline(out, prefix=run_view.description(
            params, flow="federated-text", dataset=dataset, params_file=params_file)))
        url = tracking.run_url(params, run_id)
        create_markdown_artifact(key="federated-summary",
                                 markdown=f"{federated_markdown(out)}\n\nMLflow run: [{url}]({url})",
                                 description="federated text run: accuracy and client-level privacy")
        log.info("federated: done")
    return {**out, "run_id": run_id, "flow_run_id": str(flow_run.id)}
