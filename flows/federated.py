"""Text classification with DP, as a Prefect flow:
prepare text → clients → encode → DP-FedAvg (client updates as mapped tasks) → evaluate → MLflow;
or, with ``text.training: dpsgd`` (texts held in one place), central DP-SGD on the frozen encoder's
embeddings in place of the federated rounds (record-level DP; the finetune section's DP-SGD knobs).

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
from dataclasses import dataclass

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from flows.client_map import mapped_client_updates
from flows.pipeline import INSECURE_RNG_WARNING
from flows.runner import describe_runner, mapping_runner
from privpipe.config import Params, load_params
from privpipe.federated import noise_mode
from privpipe.privacy import Event, Ledger
from tasks import paths, run_view, tracking
from tasks.common import one_at_a_time, use_torch_threads
from tasks.privacy import budget
from tasks.privacy import tracking as audit_tracking
from tasks.registered import RegisteredModel
from tasks.text.dpsgd import run_text_dpsgd
from tasks.text.features import text_features_task
from tasks.text.labels import text_labels_discovered
from tasks.text.prepare import prepare_text_task
from tasks.text.tracking import register_text_model
from tasks.text.train import record_ledger, run_federated_text
from tasks.text.trained import DpSgdTextModel, TextModel

__all__ = ["federated_text", "federated_markdown", "FederatedTextResult"]


@dataclass(frozen=True)
class FederatedTextResult:
    """What a federated text run produced: the model and its figures, its registered version, and where the run
    is recorded."""

    model: TextModel
    registered: RegisteredModel | None
    run_id: str
    flow_run_id: str
    url_hint: str  # how to open the MLflow run

    def headline(self, prefix: str) -> str:
        if isinstance(self.model, DpSgdTextModel):
            return run_view.headline(prefix, accuracy_test=self.model.accuracy_test, epsilon=self.model.epsilon,
                                     delta=self.model.delta,
                                     models=[f"model {self.registered}"] if self.registered else [])
        spend = self.model.private
        return run_view.headline(prefix, accuracy_test=self.model.accuracy_test,
                                 epsilon=spend.epsilon if spend else None, delta=spend.delta if spend else None,
                                 record_epsilon=spend.record_epsilon if spend else None,
                                 models=[f"model {self.registered}"] if self.registered else [])


def federated_markdown(model: TextModel) -> str:
    if isinstance(model, DpSgdTextModel):
        return "\n".join(["# privpipe text run (central DP-SGD)", "",
                          f"Test accuracy **{model.accuracy_test:.4f}** after {model.epochs} epochs "
                          f"({model.steps} steps, Poisson lots at q = {model.sample_rate:.4g}).",
                          f"Record-level privacy (one text): **ε = {model.epsilon:.4f}**, δ = {model.delta:g} "
                          f"({model.accountant.upper()} accountant; noise σ = {model.noise_multiplier:.4g}, "
                          f"clip C = {model.clip_norm:g}), what the dataset's lifetime budget is charged."])
    lines = ["# privpipe federated text run", "",
             f"Test accuracy **{model.accuracy_test:.4f}** after {model.rounds} of {model.rounds_planned} rounds, "
             f"K = {model.clients} clients, {model.sampling} sampling at q = {model.sample_rate:g}."]
    spend = model.private
    if spend is not None:
        lines.append(f"Client-level privacy: **ε = {spend.epsilon:.4f}**, δ = {spend.delta:g} "
                     f"({spend.accountant.upper()} accountant; noise z = {spend.noise_multiplier:.4g}, "
                     f"clip S = {spend.clip_norm:g}). For one record (two add-or-remove steps of one client): "
                     f"ε = {spend.record_epsilon:.4f} ({spend.record_accountant.upper()}), what the dataset's "
                     "lifetime budget is charged.")
    else:
        lines.append("Not private (federated.private: false): no clipping, no noise, no guarantee.")
    if model.stopped:
        lines.append(model.stopped)
    return "\n".join(lines)


@flow(name="privpipe-federated-text")
def federated_text(params_file: str = "params.yaml") -> FederatedTextResult:
    params = load_params(params_file)
    log = get_run_logger()
    if not params.privacy.secure_rng:
        log.warning(INSECURE_RNG_WARNING)
    use_torch_threads(params, "federated")  # each stage sets it again; client updates set their own
    dataset = budget.dataset_name(params, flow="federated-text")
    central = params.text.training == "dpsgd"
    with one_at_a_time(paths.TEXT_LOCK, what="another federated text run"), \
            budget.admitted(params, dataset, what="federated text run", flow="federated-text",
                            private=central or params.federated.private,
                            client_level=not central and noise_mode(params.federated.noise).client_level) \
            as admission:
        return _run(params, params_file, dataset, log, admission)


def _run(params: Params, params_file: str, dataset: str, log: logging.Logger | logging.LoggerAdapter,
         admission: budget.Admission) -> FederatedTextResult:
    central = params.text.training == "dpsgd"
    record_level = central or not noise_mode(params.federated.noise).client_level
    with tracking.tracked_run(params, params_file=params_file, flow="federated-text",
                              dataset=dataset) as run, mapping_runner(params) as runner:
        if not central:
            log.info("federated: client updates run on %s", describe_runner(params))
        if text_labels_discovered(params):
            admission.mark_published()  # prepare's label set is a release computed from the records
        prepared = prepare_text_task(params, run)
        encoded = text_features_task(params, run, prepared)

        def lifetime_can_pay(planned: Event) -> None:
            # hold the planned rounds' record-level cost instead of the client-level floor, then start
            epsilon, delta, basis = budget.planned_cost(params, planned, record_level=record_level,
                                                         unit="steps" if central else "rounds")
            admission.resize(epsilon=epsilon, delta=delta, basis=basis,
                             before="its first step" if central else "its first round")
            admission.mark_published()  # the rounds log their curves as they go

        model: TextModel
        if central:
            model = run_text_dpsgd(params, text_dir=prepared.dir, features_dir=encoded.dir,
                                   before_training=lifetime_can_pay)
        else:
            model = run_federated_text(params, text_dir=prepared.dir, features_dir=encoded.dir,
                                       updates_for=mapped_client_updates(runner), before_rounds=lifetime_can_pay)
        model.log(run, params)
        ledger = Ledger.from_json(model.ledger_file.read_text())
        # the lifetime ledger composes records: charge the record-level form, before the model is released
        audit_tracking.charge_run(params, run, flow="federated-text", dataset=dataset,
                                  ledger=ledger if central else record_ledger(params, ledger),
                                  data_version=prepared.data_version, admission=admission)
        registered = register_text_model(params, run, model, encoded.encoder)
        audit_tracking.log_audit_view(params, run, dataset=dataset, ledger=ledger)
        result = FederatedTextResult(model=model, registered=registered, run_id=run.run_id,
                                     flow_run_id=str(flow_run.id), url_hint=run.url_hint())
        run.describe(result.headline(run_view.description(params, flow="federated-text", dataset=dataset,
                                                          params_file=params_file)))
        url = run.url()
        create_markdown_artifact(key="federated-summary",
                                 markdown=f"{federated_markdown(model)}\n\nMLflow run: [{url}]({url})",
                                 description="federated text run: accuracy and client-level privacy")
        log.info("federated: done")
    return result
