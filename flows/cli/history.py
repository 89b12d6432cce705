"""What was spent and recorded: ``privpipe budget`` (each dataset's lifetime privacy spend) and
``privpipe audit`` (the recorded runs as a table)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

from privpipe.config import load_params, parse_params
from privpipe.data import DataError
from tasks.paths import dataset_name

__all__ = ["budget", "audit"]


def _project_params(given: str | None):
    """The params file given; without one, params.yaml's settings (the store, the ledger folder), or the
    defaults in a project that has none (one whose datasets each run with a params file of their own)."""
    if given is None and not Path("params.yaml").exists():
        return parse_params({}, source="defaults")
    return load_params(given or "params.yaml")


def budget(args: argparse.Namespace) -> int:
    params = _project_params(args.params)
    from tasks.privacy import budget as lifetime  # deferred: privpipe.privacy imports torch (seconds)

    if args.release:
        dataset, released = lifetime.release_reservation(params, args.release)
        print(f"released reservation {released.run} of dataset {dataset} (ε = {released.epsilon:.4g}, "
              f"δ = {released.delta:g}, {released.flow}, reserved {released.reserved_at}): taken as having "
              "released nothing")
        return 0
    ledgers = lifetime.all_lifetimes(params)
    if args.params is not None:  # the datasets that params file names: its table and its text corpus
        mine = {lifetime.dataset_name(params), *_text_dataset(params, lifetime)}
        ledgers = [ledger for ledger in ledgers if ledger.dataset in mine]
    if not ledgers:
        print(f"no runs recorded yet ({params.lifetime.ledger_dir} is empty); lifetime budget per dataset: "
              f"ε = {params.lifetime.epsilon_budget:g}, δ = {params.lifetime.delta_budget:g}")
    for ledger in ledgers:
        life = ledger.summary()
        held = (f"; ε = {life['reserved']:.4g} reserved by {life['in_progress']} run(s) in progress"
                if life["in_progress"] else "")
        print(f"dataset {life['dataset']}: spent ε = {life['spent']:.4g}, δ = {life['spent_delta']:.3g} over "
              f"{life['runs']} run(s){held}; left ε = {life['left']:.4g}, δ = {life['left_delta']:.3g} of "
              f"ε = {life['budget']:g}, δ = {life['delta_budget']:g} (basic composition; "
              f"{lifetime.ledger_path(params, ledger.dataset)})")
        print(f"  {'recorded (UTC)':<26} {'flow':<15} {'run':<33} {'data version':<34} {'ε':>8} {'δ':>9}")
        for e in ledger.entries:
            print(f"  {e.recorded_at:<26} {e.flow:<15} {e.run:<33} {e.data_version[:34]:<34} {e.epsilon:>8.4g} "
                  f"{e.delta:>9.3g}")
        for r in ledger.reservations:
            print(f"  {r.reserved_at:<26} {r.flow:<15} {r.run:<33} {_holder(lifetime, r):<34} {r.epsilon:>8.4g} "
                  f"{r.delta:>9.3g}  reserved")
        cost, basis = _run_cost(params, ledger, lifetime)
        print(f"  room for {int(life['left'] // cost)} more run(s) at {basis}")
    return 0


def _text_dataset(params, lifetime) -> list[str]:
    """The text corpus's dataset name, where the params name one that can be named (else none)."""
    try:
        return [lifetime.dataset_name(params, flow="federated-text")]
    except DataError:
        return []


def _run_cost(params, ledger, lifetime) -> tuple[float, str]:
    """What one more run on ``ledger``'s dataset is charged, and where that figure comes from. A pipeline run,
    or a record-level text run, is charged at most privacy.epsilon_budget; a client-level federated text run
    is charged its rounds' record-level cost (one record moves one client: a group of two), more than its
    client-level budget: counted as the last such run on the dataset was charged."""
    budget = params.privacy.epsilon_budget
    at_budget = budget, f"privacy.epsilon_budget = {budget:g}"
    if ledger.dataset != lifetime.dataset_name(params, flow="federated-text") \
            or ledger.dataset == lifetime.dataset_name(params):
        return at_budget
    from privpipe.federated import noise_mode  # deferred: torch (seconds), for a text dataset only

    if params.text.training == "dpsgd" or not noise_mode(params.federated.noise).client_level:
        return at_budget
    charged = [e for e in ledger.entries if e.flow == "federated-text"]
    if not charged or charged[-1].epsilon <= budget:
        return budget, (f"privacy.epsilon_budget = {budget:g} (at most: a federated text run is charged its "
                        "record-level ε, more than its client-level budget)")
    last = charged[-1]
    return last.epsilon, (f"ε = {last.epsilon:.4g} each (the record-level ε a federated text run is charged, as "
                          f"run {last.run} was; privacy.epsilon_budget = {budget:g} is client-level)")


def _holder(lifetime, reservation) -> str:
    """Who holds a reservation, and whether it can still settle it itself."""
    holder = reservation.holder
    if holder.get("kind") == "repro":
        return "dvc repro (evaluate --track settles)"
    if lifetime.holder_gone(holder):  # it released output before it died, or it would have been dropped
        return f"pid {holder.get('pid')} gone: --release?"
    return f"pid {holder.get('pid')} on {holder.get('host')}"


def audit(args: argparse.Namespace) -> int:
    # without --params: every experiment's runs, of every dataset (the store params.yaml names); with it, the
    # runs of that params file's experiment and dataset
    params = _project_params(args.params)
    since = _day(args.since, "--since")
    until = _day(args.until, "--until")
    dataset = args.dataset
    if dataset is None and args.params is not None:
        dataset = dataset_name(params)
    # deferred until the params and days are known good: reading MLflow imports it (seconds)
    from tasks.privacy.audit import audit_rows, format_table, write_csv
    from tasks.tracking import open_store

    every = args.params is None
    rows = audit_rows(params, open_store(params), dataset=dataset, since=since, until=until, every_experiment=every)
    print(format_table(rows))
    where = "every MLflow experiment" if every else f"MLflow experiment {params.run.experiment!r}"
    print(f"{len(rows)} run(s) in {where}" + (f", dataset {dataset}" if dataset else ""))
    if args.csv:
        write_csv(rows, Path(args.csv))
        print(f"written {args.csv}")
    return 0


def _day(text: str | None, option: str) -> datetime | None:
    """``YYYY-MM-DD`` (or a full ISO time) as UTC; None where the option was not given."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentError(None, f"{option}: expected a date like 2026-11-23, got {text!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
