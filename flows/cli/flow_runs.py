"""``privpipe run`` and ``privpipe federated``: a whole training run as a Prefect flow, tracked in MLflow.

Each checks its input before Prefect, MLflow or torch is imported (seconds), so that bad input is
refused at once and leaves no run state behind; then runs the flow and prints its result.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from privpipe.config import Params, check_federated_use, check_text_use, load_params
from privpipe.data import DataError

__all__ = ["run", "federated"]


def run(args: argparse.Namespace) -> int:
    params = load_params(args.params)  # validate before Prefect starts anything
    # deferred until the params are known good: Prefect, MLflow and torch take seconds to import
    from flows.cli.run_report import let_prefect_record
    from flows.pipeline import pipeline, preflight
    from flows.prefect_api import flow_api
    from tasks.privacy import budget

    preflight(params)  # bad data, δ ≥ 1/n, an impossible partition: refused before any run state exists
    budget.check_lifetime(params, budget.dataset_name(params), what="pipeline run")  # the flow checks again

    with flow_api(params):
        result = pipeline(params_file=args.params)
        _report_run(load_params(args.params), result)
        let_prefect_record(result["flow_run_id"])
    return 0


def _report_run(params: Params, result: dict) -> None:
    # deferred like the imports above (Prefect and MLflow take seconds); the run has made them by now
    from flows.cli.run_report import print_audit
    from tasks import tracking

    print()
    print(f"test accuracy   {result['accuracy_test']:.4f}   (train {result['accuracy_train']:.4f})")
    if "accuracy_target" in result:
        print(f"target domain   {result['accuracy_target']:.4f}   (accuracy on the related domain's labeled test set)")
    print(f"privacy spent   ε = {result['epsilon']:.4f}, δ = {result['delta']:g}  "
          f"({result['accountant'].upper()} accountant over all stages; per stage in metrics/privacy.json)")
    life = result["lifetime"]
    print_audit(result.get("privacy_audit", {}))
    print(f"lifetime        dataset {life['dataset']}: ε = {life['spent']:.4g} spent over {life['runs']} run(s), "
          f"{life['left']:.4g} left of {life['budget']:g} (`privpipe budget`)")
    print(f"data version    {result['data_version']}")
    if "model_version" in result:
        print(f"model           {result['model_name']} version {result['model_version']} (MLflow registry)")
    if "head" in result:
        head = result["head"]
        print(f"removal head    accuracy {head['accuracy_test']:.4f}; ({head['removal_epsilon']:g}, "
              f"{params.head.delta:g})-certified removal, gradient budget {head['gradient_budget']:.4g}; "
              f"whole model ε_CR = {head['whole_certified_removal_epsilon']:.4g} (extractor DP + head, Guo et al. Thm 5)")
        if "head_model_version" in result:
            print(f"                {result['head_model_name']} version {result['head_model_version']} "
                  "(not DP: serve it for erasure, the model above for DP)")
    print(f"MLflow          {tracking.run_url_hint(params, result['run_id'])}", flush=True)


def federated(args: argparse.Namespace) -> int:
    params = load_params(args.params)  # validate before Prefect starts anything
    _read_text_file(params)
    check_federated_use(params, clients=None if params.text.client_column else params.federated.clients)
    check_text_use(params)
    if params.text.mode == "lora":  # adapter targets named from the encoder's own layers, before anything is encoded
        from privpipe.text import check_lora_targets, encoder_dir  # deferred: torch and transformers (seconds)

        check_lora_targets(encoder_dir(params.text.encoder), params.text.lora_targets)
    from tasks.privacy import budget  # deferred: privpipe.privacy imports torch (seconds); the params are checked

    budget.check_lifetime(params, budget.dataset_name(params, flow="federated-text"), what="federated text run",
                          private=params.federated.private, client_level=params.federated.noise == "server")
    # deferred until the input is known good and the budget allows the run: Prefect and MLflow take seconds
    from flows.cli.run_report import let_prefect_record
    from flows.federated import federated_text
    from flows.prefect_api import flow_api

    with flow_api(params):
        out = federated_text(params_file=args.params)
        _report_federated(params, out)
        let_prefect_record(out["flow_run_id"])
    return 0


def _report_federated(params: Params, out: dict) -> None:
    # deferred like the imports above (Prefect and MLflow take seconds); the run has made them by now
    from flows.cli.run_report import print_audit
    from tasks import tracking

    print()
    print(f"test accuracy   {out['accuracy_test']:.4f}   after {out['rounds']} rounds, K = {out['clients']} clients "
          f"({params.text.mode} encoder)")
    if out["private"] and out["noise"] == "client":
        print(f"privacy spent   ε = {out['record_epsilon']:.4f}, δ = {out['delta']:g}  "
              f"({out['record_accountant'].upper()}, record-level, the worst client: each client's own DP-SGD over "
              "the rounds it took part in; the server saw only private updates; charged to the lifetime budget)")
    elif out["private"]:
        print(f"privacy spent   ε = {out['epsilon']:.4f}, δ = {out['delta']:g}  ({out['accountant'].upper()} "
              f"accountant, client-level: one client's records added or removed, K taken as public)")
        print(f"                ε = {out['record_epsilon']:.4f}, δ = {out['delta']:g}  "
              f"({out['record_accountant'].upper()}, record-level: one record moves one client's update; charged "
              "to the lifetime budget)")
    else:
        print("privacy spent   not private (federated.private: false)")
    print_audit(out.get("privacy_audit", {}))
    if out.get("stopped"):
        print(f"note            {out['stopped']}")
    if "model_version" in out:
        print(f"model           {out['model_name']} version {out['model_version']} (MLflow registry)")
    print(f"MLflow          {tracking.run_url_hint(params, out['run_id'])}", flush=True)


def _read_text_file(params: Params) -> None:
    """Read the text file once before Prefect starts: a missing file or a bad line fails now, not in the
    flow after MLflow opened a run."""
    text = params.text
    if text.format == "20newsgroups":  # a tarball, scikit-learn's cache or a folder: the loader says which is wrong
        from privpipe.text.corpus import load_corpus  # deferred: privpipe.text imports torch (seconds)

        load_corpus(text.path, format=text.format, text_column=text.text_column, label_column=text.label_column,
                    client_column=None, split_column=None, test_fraction=text.test_fraction, seed=params.run.seed,
                    download=text.download)
        return
    if not Path(text.path).is_file():
        raise DataError(f"{text.path}: text file not found (text.path: a JSONL or CSV file with "
                        f"{text.text_column!r} and {text.label_column!r} columns)")
    from privpipe.text.corpus import load_corpus  # deferred: privpipe.text imports torch (seconds)

    load_corpus(text.path, format=text.format, text_column=text.text_column, label_column=text.label_column,
                client_column=text.client_column, split_column=text.split_column,
                test_fraction=text.test_fraction, seed=params.run.seed)
