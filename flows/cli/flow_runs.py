"""``privpipe run`` and ``privpipe federated``: a whole training run as a Prefect flow, tracked in MLflow.

Each checks its input before Prefect, MLflow or torch is imported (seconds), so that bad input is
refused at once and leaves no run state behind; then runs the flow and prints its result.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from flows.heap import command, importing
from privpipe.config import Params, check_federated_use, check_text_use, load_params
from privpipe.data import DataError
from tasks.paths import for_params

if TYPE_CHECKING:  # types only: the flows import Prefect, MLflow and torch (seconds), deferred below
    from flows.federated import FederatedTextResult
    from flows.pipeline import RunResult

__all__ = ["run", "federated"]


def run(args: argparse.Namespace) -> int:
    with command():  # garbage collection kept off the big imports and settled per stage (flows.heap)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    with importing():
        from tasks.recipe import load_run_params  # deferred: the data readers (torch, Prefect come later)

    params = load_run_params(args.params)  # validate before Prefect starts anything; a recipe fitted where none is
    with importing():
        # deferred until the params are known good: Prefect, MLflow and torch take seconds to import
        from flows.cli.run_report import let_prefect_record
        from flows.pipeline import pipeline, preflighted
        from flows.prefect_api import flow_api
        from tasks.privacy import budget

    # bad data, δ ≥ 1/n, an impossible partition, a model name that holds another dataset's versions: refused
    # before any run state exists. The flow takes these checks as its own, and its prepare stage the sets they
    # prepared (in a scratch folder, removed when the block ends): the data is read and checked once
    with preflighted(params, hand_over=True):
        budget.check_lifetime(params, budget.dataset_name(params), what="pipeline run")  # the flow checks again
        with flow_api(params):
            result = pipeline(params_file=args.params)
            _report_run(params, result)
            let_prefect_record(result.flow_run_id)
    return 0


def _report_run(params: Params, result: RunResult) -> None:
    # deferred like the imports above (Prefect and MLflow take seconds); the run has made them by now
    from flows.cli.run_report import print_audit

    evaluation = result.evaluation
    print()
    print(f"test accuracy   {evaluation.accuracy_test:.4f}   (train {evaluation.accuracy_train:.4f})")
    if evaluation.accuracy_target is not None:
        print(f"target domain   {evaluation.accuracy_target:.4f}   (accuracy on the related domain's labeled test set)")
    print(f"privacy spent   ε = {evaluation.epsilon:.4f}, δ = {evaluation.delta:g}  "
          f"({evaluation.accountant.upper()} accountant over all stages; per stage in "
          f"{for_params(params).metrics_file('privacy')})")
    life = result.lifetime.summary()
    print_audit(dict(evaluation.privacy_audit or {}))
    print(f"lifetime        dataset {life['dataset']}: ε = {life['spent']:.4g} spent over {life['runs']} run(s), "
          f"{life['left']:.4g} left of {life['budget']:g} (`privpipe budget`)")
    print(f"data version    {result.data_version}")
    if result.model is not None:
        print(f"model           {result.model.name} version {result.model.version} (MLflow registry)")
    head = result.head
    if head is not None:
        print(f"removal head    accuracy {head.accuracy_test:.4f}; ({head.removal_epsilon:g}, "
              f"{params.head.delta:g})-certified removal, gradient budget {head.gradient_budget:.4g}; "
              f"whole model ε_CR = {head.whole_certified_removal_epsilon:.4g} "
              "(extractor DP + head, Guo et al. Thm 5)")
        if head.registered is not None:
            print(f"                {head.registered.name} version {head.registered.version} "
                  "(not DP: serve it for erasure, the model above for DP)")
    print(f"MLflow          {result.url_hint}", flush=True)


def federated(args: argparse.Namespace) -> int:
    with command():  # (as run)
        return _federated(args)


def _federated(args: argparse.Namespace) -> int:
    params = load_params(args.params)  # validate before Prefect starts anything
    central = params.text.training == "dpsgd"  # central DP-SGD: the federated section is not used
    if not central:
        check_federated_use(params, clients=None if params.text.client_column else params.federated.clients)
    check_text_use(params)
    _check_text_data(params)
    if params.text.mode == "lora":  # adapter targets named from the encoder's own layers, before anything is encoded
        from privpipe.text import check_lora_targets, encoder_dir  # deferred: torch and transformers (seconds)

        check_lora_targets(encoder_dir(params.text.encoder), params.text.lora_targets)
    # deferred: privpipe.privacy and .federated import torch (seconds); the params are checked
    from privpipe.federated import noise_mode
    from tasks.privacy import budget

    client_level = not central and noise_mode(params.federated.noise).client_level
    budget.check_lifetime(params, budget.dataset_name(params, flow="federated-text"), what="federated text run",
                          private=central or params.federated.private, client_level=client_level)
    with importing():
        # deferred until the input is known good and the budget allows the run: Prefect and MLflow take seconds
        from flows.cli.run_report import let_prefect_record
        from flows.federated import federated_text
        from flows.prefect_api import flow_api
        from tasks.tracking import ensure_models_of

    # the text model's name holds no other corpus's versions: refused before any work
    ensure_models_of(params, budget.dataset_name(params, flow="federated-text"),
                     {params.text.model_name: "text.model_name"})

    with flow_api(params):
        result = federated_text(params_file=args.params)
        _report_federated(params, result)
        let_prefect_record(result.flow_run_id)
    return 0


def _report_federated(params: Params, result: FederatedTextResult) -> None:
    # deferred like the imports above (Prefect and MLflow take seconds); the run has made them by now
    from flows.cli.run_report import print_audit
    from tasks.text.trained import DpSgdTextModel

    print()
    if isinstance(result.model, DpSgdTextModel):
        central = result.model
        print(f"test accuracy   {central.accuracy_test:.4f}   after {central.epochs} epochs of central DP-SGD "
              f"({central.steps} steps, q = {central.sample_rate:.4g}; frozen encoder)")
        print(f"privacy spent   ε = {central.epsilon:.4f}, δ = {central.delta:g}  ({central.accountant.upper()}, "
              f"record-level: one text added or removed; σ = {central.noise_multiplier:.4g}, clip C = "
              f"{central.clip_norm:g}; charged to the lifetime budget)")
        print_audit(dict(central.privacy_audit))
        _print_registered(result)
        return
    model, spend = result.model, result.model.private
    print(f"test accuracy   {model.accuracy_test:.4f}   after {model.rounds} rounds, K = {model.clients} clients "
          f"({params.text.mode} encoder)")
    if spend is not None and not spend.client_level:
        print(f"privacy spent   ε = {spend.record_epsilon:.4f}, δ = {spend.delta:g}  "
              f"({spend.record_accountant.upper()}, record-level, the worst client: each client's own DP-SGD over "
              "the rounds it took part in; the server saw only private updates; charged to the lifetime budget)")
    elif spend is not None:
        print(f"privacy spent   ε = {spend.epsilon:.4f}, δ = {spend.delta:g}  ({spend.accountant.upper()} "
              f"accountant, client-level: one client's records added or removed, K taken as public)")
        print(f"                ε = {spend.record_epsilon:.4f}, δ = {spend.delta:g}  "
              f"({spend.record_accountant.upper()}, record-level: one record moves one client's update; charged "
              "to the lifetime budget)")
    else:
        print("privacy spent   not private (federated.private: false)")
    print_audit(dict(model.privacy_audit))
    if model.stopped:
        print(f"note            {model.stopped}")
    _print_registered(result)


def _print_registered(result: FederatedTextResult) -> None:
    if result.registered is not None:
        print(f"model           {result.registered.name} version {result.registered.version} (MLflow registry)")
    print(f"MLflow          {result.url_hint}", flush=True)


def _check_text_data(params: Params) -> None:
    """Read the text file once before Prefect starts, and make the clients the flow would make, writing
    nothing: a missing file, a bad line, or a corpus too small for its clients fails now, not in the flow
    after MLflow opened a run (issue 35 point 6)."""
    text = params.text
    if text.format != "20newsgroups" and not Path(text.path).is_file():
        raise DataError(f"{text.path}: text file not found (text.path: a JSONL or CSV file with "
                        f"{text.text_column!r} and {text.label_column!r} columns)")
    # deferred: the text and federated modules import torch, the prepare task Prefect (seconds)
    from tasks.text.labels import text_labels_discovered
    from tasks.text.prepare import check_text_clients, current_corpus

    # a 20newsgroups tarball, scikit-learn's cache or a folder: the loader says which is wrong
    corpus, _ = current_corpus(params)  # the file's own checks first
    if not text_labels_discovered(params):  # (refused for server noise)
        # a label set to discover is drawn under the run's admission: the clients it leaves are checked there
        check_text_clients(params, corpus)
