"""The ``privpipe`` command line.

    privpipe run [--params params.yaml]          the pipeline as a Prefect flow, tracked in MLflow
    privpipe stage NAME [--params ...] [--track] one stage alone (what dvc repro calls); NAME is one of
                                                 prepare partition dp_pca teachers aggregate student finetune head evaluate
    privpipe federated [--params params.yaml]    federated text classification with client-level DP (Prefect flow)
    privpipe init-data                           write the embedded default data (digits) if missing
    privpipe forget ID... [--reason TEXT]        queue deletion requests (durable; unknown ids are refused)
    privpipe removals [--params ...]             process the queue as a Prefect flow (remove, register, new data version)
    privpipe requests [--record ID] [--redact]   list deletion requests and their state (and coverage)
    privpipe serve [--params ...] [--use-running-server]   the Prefect deployments: scheduled retraining, deletion processing
    privpipe budget [--params ...]               each dataset's lifetime privacy spend, run by run
    privpipe audit [--dataset D] [--since DAY] [--until DAY] [--csv FILE]   the recorded runs as a table
    privpipe privacy dpsgd --noise-multiplier 1.1 --sample-rate 0.01 --steps 10000 --delta 1e-5

Bad input ends with one line on stderr naming the key or file, and exit code 2;
a refused budget or a failed stage with exit code 1; a privacy audit that contradicts
the claimed ε (a bug: the model is not registered) with exit code 3.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from typing import Sequence

from tasks import STAGE_MODULES

SPENDING_STAGES = ("dp_pca", "aggregate", "finetune")  # the stages that add events to the ledger


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="privpipe", description="Privacy-preserving ML pipeline.")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the whole pipeline as a Prefect flow")
    run.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")

    stage = commands.add_parser("stage", help="run one stage without Prefect (dvc repro uses this)")
    stage.add_argument("name", choices=tuple(STAGE_MODULES))
    stage.add_argument("--params", default="params.yaml")
    stage.add_argument("--track", action="store_true",
                       help="evaluate only: record the finished pipeline's outputs as an MLflow run")

    federated = commands.add_parser("federated", help="federated text classification with client-level DP "
                                                      "(text and federated sections of the params file)")
    federated.add_argument("--params", default="params.yaml")

    init = commands.add_parser("init-data", help="write the embedded default dataset under data/raw if missing")
    init.add_argument("--params", default="params.yaml")

    forget = commands.add_parser("forget", help="queue deletion requests for records (by record id)")
    forget.add_argument("record_ids", nargs="+", metavar="RECORD_ID")
    forget.add_argument("--reason", default=None, help="why; the queue keeps only its HMAC (so whoever holds the "
                                                       "reason can check it), MLflow nothing")
    forget.add_argument("--params", default="params.yaml")

    removals = commands.add_parser("removals", help="process the pending deletion requests (Prefect flow)")
    removals.add_argument("--params", default="params.yaml")

    requests = commands.add_parser("requests", help="list deletion requests and their state")
    requests.add_argument("--record", default=None, metavar="RECORD_ID",
                          help="only the requests for this record id (matched by its hash)")
    requests.add_argument("--redact", action="store_true",
                          help="rewrite requests an older privpipe journaled with the raw record id and reason, "
                               "keeping only their hashes")

    serve = commands.add_parser("serve", help="serve the scheduled-retrain and deletion-processing deployments "
                                              "(starts a local Prefect server if none answers; its log: "
                                              "PREFECT_HOME/server.log)")
    serve.add_argument("--params", default="params.yaml")
    serve.add_argument("--list", action="store_true", help="only print the deployments and their schedules")
    serve.add_argument("--use-running-server", action="store_true",
                       help="serve on the Prefect server answering at schedule.prefect_api_url even when it is not "
                            "this project's (its PREFECT_HOME differs or is unknown); refused without this flag")

    budget = commands.add_parser("budget", help="each dataset's lifetime privacy spend and what is left")
    budget.add_argument("--params", default="params.yaml")

    audit = commands.add_parser("audit", help="the recorded runs (from MLflow): data version, ε per stage, "
                                              "accuracy, model version")
    audit.add_argument("--params", default="params.yaml")
    audit.add_argument("--dataset", default=None, help="only runs on this dataset (e.g. digits)")
    audit.add_argument("--since", default=None, help="only runs started on or after this day (YYYY-MM-DD, UTC)")
    audit.add_argument("--until", default=None, help="only runs started before this day (YYYY-MM-DD, UTC)")
    audit.add_argument("--csv", default=None, metavar="FILE", help="also write the table as CSV")

    privacy = commands.add_parser("privacy", help="privacy calculators")
    calculators = privacy.add_subparsers(dest="calculator", required=True)
    dpsgd = calculators.add_parser("dpsgd", help="ε of DP-SGD (Poisson-subsampled Gaussian) for given σ, q, T, δ")
    dpsgd.add_argument("--noise-multiplier", type=_positive_float, required=True, help="σ")
    dpsgd.add_argument("--sample-rate", type=_positive_float, required=True, help="q, the Poisson sampling rate (≈ lot size / n)")
    dpsgd.add_argument("--steps", type=_positive_int, required=True, help="T")
    dpsgd.add_argument("--delta", type=_positive_float, required=True, help="δ")
    dpsgd.add_argument("--accountant", choices=("best", "pld", "rdp"), default="best")
    return parser


def _privacy_dpsgd(args: argparse.Namespace) -> int:
    from privpipe.privacy import PoissonGaussianEvent, compute_epsilon

    if not args.sample_rate <= 1:
        raise ValueError(f"--sample-rate: must be in (0, 1], got {args.sample_rate}")
    if not args.delta < 1:
        raise ValueError(f"--delta: must be in (0, 1), got {args.delta}")
    event = PoissonGaussianEvent(stage="dpsgd", noise_multiplier=args.noise_multiplier,
                                 sample_rate=args.sample_rate, steps=args.steps)
    spend = compute_epsilon([event], delta=args.delta, accountant=args.accountant)
    print(f"ε = {spend.epsilon:.4f} at δ = {spend.delta:g} ({spend.accountant.upper()} accountant; "
          f"σ = {args.noise_multiplier:g}, q = {args.sample_rate:g}, T = {args.steps}, Poisson sampling, "
          "add-or-remove-one adjacency)")
    return 0


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of each record (not the one at set-up)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        """Ignored: the stream is always the current sys.stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        # importing prefect (every stage does) puts a console handler on the root logger, which the
        # stage's records reach too: write only where there is none, else each line comes twice
        if any(isinstance(h, logging.StreamHandler) for h in logging.getLogger().handlers):
            return False
        return bool(super().filter(record))


def _log_stages_to_stderr() -> None:
    logger = logging.getLogger("privpipe")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def _stage(args: argparse.Namespace) -> int:
    from privpipe.config import check_pipeline_use, load_params

    _log_stages_to_stderr()

    import importlib

    params = load_params(args.params)
    check_pipeline_use(params)
    if args.name in SPENDING_STAGES:  # dvc repro: the run is charged at evaluate --track; refuse before spending
        from tasks.privacy import budget

        budget.check_lifetime(params, budget.dataset_name(params), what=f"stage {args.name}")
    from tasks.common import use_torch_threads

    use_torch_threads(params, args.name, quiet=True)  # run.torch_threads; the torch-heavy stages say so themselves
    run = getattr(importlib.import_module(STAGE_MODULES[args.name]), f"run_{args.name}")
    out = run(params)
    if args.track:
        if args.name != "evaluate":
            raise ValueError("--track: only the evaluate stage can record a run")
        from flows.record import record_finished_pipeline
        from tasks import tracking

        out = record_finished_pipeline(params, out, params_file=args.params)
        print(f"recorded MLflow run {out['run_id']}")
        print(f"MLflow          {tracking.run_url_hint(params, out['run_id'])}")
    return 0


def _init_data(args: argparse.Namespace) -> int:
    from privpipe.config import load_params
    from tasks.prepare import ensure_default_data

    params = load_params(args.params)
    written = ensure_default_data(params)
    print(f"{params.prepare.path}: {'written from scikit-learn' if written else 'present'}")
    return 0


def _forget(args: argparse.Namespace) -> int:
    from privpipe.config import load_params
    from privpipe.requests import RequestQueue
    from tasks import paths
    from tasks.removal.erase import current_record_ids

    params = load_params(args.params)
    queue = RequestQueue(paths.REQUESTS)
    known = current_record_ids(params, queue)
    accepted = queue.submit(args.record_ids, reason=args.reason, known=known.__contains__)
    for request in accepted:
        print(f"queued {request.request_id} (received {request.received_at})")
    # the others, by their place on the command line: record ids are not echoed
    new, first = {r.record_hash for r in accepted}, {}
    requests = queue.read()
    earliest = {}  # each record's first request (an older privpipe may have journaled more than one)
    for request in requests:
        earliest.setdefault(request.record_hash, request)
    for place, record_id in enumerate(args.record_ids, start=1):
        if record_id in first:
            print(f"record id #{place} repeats #{first[record_id]}: one request")
            continue
        first[record_id] = place
        digest = queue.hash_record_id(record_id)
        if digest not in new:
            earlier = earliest[digest]
            print(f"record id #{place} already has request {earlier.request_id} ({earlier.status}): not queued again")
    print(f"{len(accepted)} deletion request(s) queued in {queue.path}; `privpipe removals` processes them")
    _legacy_note(requests, queue)
    if accepted:
        from flows.notify import announce_deletion_requests

        print(announce_deletion_requests(params, [r.request_id for r in accepted]))
    return 0


def _legacy_note(requests, queue) -> None:
    legacy = sum(r.legacy for r in requests)
    if legacy:
        print(f"{legacy} request(s) in {queue.path} still hold the raw record id and reason (journaled by an older "
              "privpipe): `privpipe requests --redact` rewrites them as hashes")


def _requests(args: argparse.Namespace) -> int:
    from privpipe.requests import RequestQueue
    from tasks import paths

    queue = RequestQueue(paths.REQUESTS)
    if args.redact:
        print(f"{queue.redact()} request(s) rewritten with hashed record ids and reasons in {queue.path}")
    requests = queue.requests_for(args.record) if args.record is not None else queue.read()
    print(f"{'request':<44} {'status':<9} {'received':<28} {'completed':<28} mechanism / head version / uncovered")
    for r in requests:
        audit = r.audit or {}
        what = f"{audit.get('mechanism', '')} {audit.get('version_before', '')}→{audit.get('version_after', '')}" \
            if audit else ""
        if audit.get("uncovered"):
            what += " / not covered: " + ", ".join(audit["uncovered"])
        print(f"{r.request_id:<44} {r.status:<9} {r.received_at:<28} {r.completed_at or '':<28} {what}")
    counts = {s: sum(r.status == s for r in requests) for s in ("pending", "in_batch", "done")}
    print(f"{len(requests)} requests: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    _legacy_note(requests, queue)
    return 0


def _removals(args: argparse.Namespace) -> int:
    from privpipe.config import load_params
    from privpipe.requests import RequestQueue
    from tasks import paths
    from tasks.removal.steps import ensure_head_for

    params = load_params(args.params)
    # before Prefect starts: a damaged journal, or requests with no head, fail here (the flow checks again)
    ensure_head_for(params, RequestQueue(paths.REQUESTS))
    from flows.removals import removals

    results = removals(params_file=args.params)
    if not results:
        print("no pending deletion requests")
    for out in results:
        head = (f"head version {out['head_version']}; budget used {out['budget_used']:.4g} of {out['budget']:.4g}"
                if out["budget"] is not None else "no head")
        print(f"{out['batch_id']}: {out['requests']} request(s) done, {out['rows_removed']} head row(s) removed; "
              f"{head}; data version {out['data_version']}"
              + ("; the head was retrained (budget spent)" if out["retrained"] else ""))
        for flagged in out["uncovered"]:
            print(f"ACTION: {flagged['model']} version {flagged['version']} does not cover {len(flagged['requests'])} "
                  f"deletion request(s), {len(flagged['in_batch'])} of this batch (tagged privacy.erasure.*): "
                  f"{flagged['action']}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from privpipe.config import load_params

    params = load_params(args.params)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.deploy import (ForeignPrefectServer, PrefectServerError, build_deployments, cancel_missed_runs,
                              crash_orphaned_runs, describe_deployment, prefect_server, serve_deployments)

    if args.list:
        for deployment in build_deployments(params, params_file=args.params):
            print(describe_deployment(deployment))
        return 0

    url = params.schedule.prefect_api_url
    try:
        with prefect_server(url, use_running=args.use_running_server) as server, \
                temporary_settings(updates={PREFECT_API_URL: url}):
            print(f"{server.describe()}; Ctrl-C stops serving", flush=True)
            deployments = build_deployments(params, params_file=args.params)
            # runs interrupted when the server last stopped would block their deployment for good; runs that
            # came due while nothing served them would all run back to back
            orphans = crash_orphaned_runs(deployments) if server.started else []
            for line in orphans + cancel_missed_runs(deployments):
                print(line, flush=True)
            serve_deployments(params, params_file=args.params)
    except ForeignPrefectServer as exc:
        print(f"privpipe: refused: {exc}", file=sys.stderr)
        return 1
    except PrefectServerError as exc:
        print(f"privpipe: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _budget(args: argparse.Namespace) -> int:
    from privpipe.config import load_params
    from tasks.privacy import budget

    params = load_params(args.params)
    ledgers = budget.all_lifetimes(params)
    if not ledgers:
        print(f"no runs recorded yet ({params.lifetime.ledger_dir} is empty); lifetime budget per dataset: "
              f"ε = {params.lifetime.epsilon_budget:g}, δ = {params.lifetime.delta_budget:g}")
    for ledger in ledgers:
        life = ledger.summary()
        print(f"dataset {life['dataset']}: spent ε = {life['spent']:.4g}, δ = {life['spent_delta']:.3g} over "
              f"{life['runs']} run(s); left ε = {life['left']:.4g}, δ = {life['left_delta']:.3g} of "
              f"ε = {life['budget']:g}, δ = {life['delta_budget']:g} (basic composition; "
              f"{budget.ledger_path(params, ledger.dataset)})")
        print(f"  {'recorded (UTC)':<26} {'flow':<15} {'run':<33} {'data version':<34} {'ε':>8} {'δ':>9}")
        for e in ledger.entries:
            print(f"  {e.recorded_at:<26} {e.flow:<15} {e.run:<33} {e.data_version[:34]:<34} {e.epsilon:>8.4g} "
                  f"{e.delta:>9.3g}")
        runs_left = int(life["left"] // params.privacy.epsilon_budget)
        print(f"  room for {runs_left} more run(s) at privacy.epsilon_budget = {params.privacy.epsilon_budget:g}")
    return 0


def _audit(args: argparse.Namespace) -> int:
    from pathlib import Path

    from privpipe.config import load_params
    from tasks.privacy.audit import audit_rows, format_table, parse_day, write_csv

    params = load_params(args.params)
    since = parse_day(args.since, key="--since") if args.since else None
    until = parse_day(args.until, key="--until") if args.until else None
    rows = audit_rows(params, dataset=args.dataset, since=since, until=until)
    print(format_table(rows))
    print(f"{len(rows)} run(s) in MLflow experiment {params.run.experiment!r}"
          + (f", dataset {args.dataset}" if args.dataset else ""))
    if args.csv:
        write_csv(rows, Path(args.csv))
        print(f"written {args.csv}")
    return 0


def _print_audit(audit: dict) -> None:
    """The membership audit's line (see tasks.privacy.membership_audit); nothing when it was off."""
    if "privacy.audit.epsilon_lower_bound" in audit:
        aucs = ", ".join(f"{audit[f'privacy.audit.{name}.auc']:.3f} ({name})" for name in ("loss", "calibrated")
                         if f"privacy.audit.{name}.auc" in audit)
        bound, ceiling = audit["privacy.audit.epsilon_lower_bound"], audit["privacy.audit.max_provable_epsilon"]
        verdict = ("within the claimed ε" if bound <= audit["claimed_epsilon"] else "ABOVE the claimed ε (see the log)")
        print(f"privacy audit   membership AUC {aucs}; empirical ε ≥ {bound:.3f}, {verdict} "
              f"(at most {ceiling:.2f} provable with {audit['privacy.audit.members']:.0f} records a side)")
    elif audit:
        print(f"privacy audit   skipped: {audit['skipped']}")


def _run(args: argparse.Namespace) -> int:
    from privpipe.config import load_params

    params = load_params(args.params)  # validate before Prefect starts anything
    from flows.pipeline import pipeline, preflight
    from tasks import tracking
    from tasks.privacy import budget

    preflight(params)  # bad data, δ ≥ 1/n, an impossible partition: refused before any run state exists
    budget.check_lifetime(params, budget.dataset_name(params), what="pipeline run")  # the flow checks again

    result = pipeline(params_file=args.params)
    params = load_params(args.params)
    print()
    print(f"test accuracy   {result['accuracy_test']:.4f}   (train {result['accuracy_train']:.4f})")
    if "accuracy_target" in result:
        print(f"target domain   {result['accuracy_target']:.4f}   (accuracy on the related domain's labeled test set)")
    print(f"privacy spent   ε = {result['epsilon']:.4f}, δ = {result['delta']:g}  "
          f"({result['accountant'].upper()} accountant over all stages; per stage in metrics/privacy.json)")
    life = result["lifetime"]
    _print_audit(result.get("privacy_audit", {}))
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
    _let_prefect_record(result["flow_run_id"])
    return 0


def _federated(args: argparse.Namespace) -> int:
    from privpipe.config import load_params

    params = load_params(args.params)  # validate before Prefect starts anything
    from pathlib import Path

    from privpipe.data import DataError

    if params.text.format != "20newsgroups":
        if not Path(params.text.path).is_file():
            raise DataError(f"{params.text.path}: text file not found (text.path: a JSONL or CSV file with "
                            f"{params.text.text_column!r} and {params.text.label_column!r} columns)")
        from privpipe.text.corpus import load_corpus

        # read here too, before Prefect starts: a bad line fails now, not in the flow after MLflow opened a run
        text = params.text
        load_corpus(text.path, format=text.format, text_column=text.text_column, label_column=text.label_column,
                    client_column=text.client_column, split_column=text.split_column,
                    test_fraction=text.test_fraction, seed=params.run.seed)
    from privpipe.config import check_federated_use

    check_federated_use(params, clients=None if params.text.client_column else params.federated.clients)
    from tasks.privacy import budget

    budget.check_lifetime(params, budget.dataset_name(params, flow="federated-text"), what="federated text run",
                          private=params.federated.private, client_level=True)
    from flows.federated import federated_text
    from tasks import tracking

    out = federated_text(params_file=args.params)
    print()
    print(f"test accuracy   {out['accuracy_test']:.4f}   after {out['rounds']} rounds, K = {out['clients']} clients "
          f"({params.text.mode} encoder)")
    if out["private"]:
        print(f"privacy spent   ε = {out['epsilon']:.4f}, δ = {out['delta']:g}  ({out['accountant'].upper()} "
              f"accountant, client-level: one client's records added or removed)")
        print(f"                ε = {out['record_epsilon']:.4f}, δ = {out['delta']:g}  "
              f"({out['record_accountant'].upper()}, record-level: one record changes one client; charged to the "
              "lifetime budget)")
    else:
        print("privacy spent   not private (federated.private: false)")
    _print_audit(out.get("privacy_audit", {}))
    if out.get("stopped"):
        print(f"note            {out['stopped']}")
    if "model_version" in out:
        print(f"model           {out['model_name']} version {out['model_version']} (MLflow registry)")
    print(f"MLflow          {tracking.run_url_hint(params, out['run_id'])}", flush=True)
    _let_prefect_record(out["flow_run_id"])
    return 0


def _let_prefect_record(flow_run_id: str) -> None:
    """The temporary Prefect server stops when this process ends: first let it record every task run."""
    from flows.runner import wait_until_recorded

    if not wait_until_recorded(flow_run_id):
        print("note            the temporary Prefect server had not recorded every task run's final state after "
              "120 s; the run itself is complete (MLflow and the files above)", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from privpipe.config import ConfigError
    from privpipe.data import DataError
    from privpipe.requests import QueueBusy, QueueError, UnknownRecord
    from tasks.common import PipelineBusy

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            if args.command == "privacy":
                return _privacy_dpsgd(args)
            if args.command == "stage":
                return _stage(args)
            if args.command == "init-data":
                return _init_data(args)
            if args.command == "federated":
                return _federated(args)
            if args.command in ("forget", "requests", "removals", "serve", "budget", "audit"):
                return {"forget": _forget, "requests": _requests, "removals": _removals, "serve": _serve,
                        "budget": _budget, "audit": _audit}[args.command](args)
            return _run(args)
    except (QueueBusy, PipelineBusy) as exc:
        print(f"privpipe: busy: {exc}", file=sys.stderr)
        return 1
    except (ConfigError, DataError, QueueError, UnknownRecord, ValueError, FileNotFoundError) as exc:
        print(f"privpipe: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        if _raised_by(exc, "privpipe.privacy", "BudgetExceeded"):
            print(f"privpipe: refused: {exc}", file=sys.stderr)
            return 1
        if _raised_by(exc, "privpipe.privacy.membership", "PrivacyAuditFailed"):  # a bug: say so loudly
            print(f"privpipe: PRIVACY AUDIT FAILED: {exc}", file=sys.stderr)
            return 3
        raise


def _raised_by(exc: BaseException, module: str, name: str) -> bool:
    """Whether ``exc`` is ``module.name``. Looked up, not imported: privpipe.privacy imports torch (seconds),
    and where it was never imported nothing can have raised its exception, e.g. a typo in the params file."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(exc, getattr(loaded, name))


if __name__ == "__main__":
    sys.exit(main())
