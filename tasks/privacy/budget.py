"""The lifetime privacy budget of each dataset, on disk: ``<lifetime.ledger_dir>/<dataset>.json``.

    privpipe budget                  # what each dataset has spent, what is left, run by run

Before a pipeline or federated run starts, :func:`check_lifetime` refuses it if the run's
own budget (``privacy.epsilon_budget``, ``privacy.delta``: the most it can spend) would take
the dataset past ``lifetime``. The ledgers compose record-level ε; a client-level run (the
federated text flow) costs more per record than its own budget, so once its rounds are
planned :func:`check_lifetime_planned` checks their record-level form too. When the run has
released its model, :func:`record_lifetime` adds what it actually spent, record-level. The
file lives with the data and is versioned by DVC
(``dvc add`` after each write, when the project is a DVC repository and we are not inside
``dvc repro``, which holds DVC's lock: ``make repro`` adds it afterwards). A run that dies
before it records has released nothing and costs nothing.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from privpipe.config import Params
from privpipe.data import DataError
from privpipe.privacy import Event, Ledger, LifetimeLedger, RunSpend, record_level_ledger
from tasks.common import PipelineBusy, exclusive_lock, stage_logger, write_text
from tasks.versioning import dvc

__all__ = ["dataset_name", "ledger_path", "load_lifetime", "check_lifetime", "check_lifetime_planned",
           "record_lifetime", "spend_of_run", "all_lifetimes", "one_run_per_dataset"]


def dataset_name(params: Params, *, flow: str = "pipeline") -> str:
    """One ledger per dataset: the data file's (or folder's) name without suffix, e.g. ``digits``."""
    if flow == "federated-text":
        return "20newsgroups" if params.text.format == "20newsgroups" else Path(params.text.path).stem
    return Path(params.prepare.path).stem


def ledger_path(params: Params, dataset: str) -> Path:
    return Path(params.lifetime.ledger_dir) / f"{dataset}.json"


def load_lifetime(params: Params, dataset: str) -> LifetimeLedger:
    """The dataset's ledger (empty if it has none yet); DataError naming the file if it is damaged."""
    path = ledger_path(params, dataset)
    raw = None
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
            return LifetimeLedger.from_dict(raw, epsilon_budget=params.lifetime.epsilon_budget,
                                            delta_budget=params.lifetime.delta_budget)
        except (json.JSONDecodeError, ValueError) as exc:
            raise DataError(f"{path}: damaged lifetime ledger ({exc}); restore it with `dvc checkout {path}`") from None
    return LifetimeLedger(dataset=dataset, epsilon_budget=params.lifetime.epsilon_budget,
                          delta_budget=params.lifetime.delta_budget)


def check_lifetime(params: Params, dataset: str, *, what: str, private: bool = True,
                   client_level: bool = False) -> LifetimeLedger:
    """Refuse (LifetimeBudgetExceeded) a run whose budget the dataset can no longer pay.

    ``client_level``: the run's budget binds client-level ε, only a floor of its record-level
    cost (checked again by :func:`check_lifetime_planned`)."""
    ledger = load_lifetime(params, dataset)
    if not private:  # a non-private model of the data has no finite ε: it would end the dataset's budget
        ledger.ensure_affordable(epsilon=float("inf"), delta=0.0, what=f"{what} (not private)")
    basis = ("privacy.epsilon_budget, client-level: one record costs more, checked before the first round"
             if client_level else "privacy.epsilon_budget, privacy.delta")
    ledger.ensure_affordable(epsilon=params.privacy.epsilon_budget, delta=params.privacy.delta, what=what,
                             basis=basis)
    return ledger


@contextmanager
def one_run_per_dataset(params: Params, dataset: str) -> Iterator[None]:
    """Hold the dataset's run lock from the lifetime check to the charge, so that two runs on the same
    data (pipeline or text flow, in any process) cannot both pass a check that only one can pay.
    Refuses (PipelineBusy) at once rather than wait: a queued run would check a stale balance."""
    path = ledger_path(params, dataset)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(f".{path.stem}.run.lock")
    try:
        with exclusive_lock(lock, blocking=False):
            yield
    except BlockingIOError:
        raise PipelineBusy(f"{lock}: another run on dataset {dataset!r} is in progress; wait for it (its lifetime "
                           "budget is checked and charged by one run at a time)") from None


def check_lifetime_planned(params: Params, dataset: str, *, planned: Event, what: str,
                           record_level: bool = False) -> None:
    """Refuse (LifetimeBudgetExceeded) a run whose planned event, record-level, the dataset can no
    longer pay. ``record_level``: the event already is (client noise); else it is client-level and
    takes its record-level form (privpipe.privacy.group)."""
    run_ledger = Ledger(epsilon_budget=params.privacy.epsilon_budget, delta=params.privacy.delta,
                        accountant=params.privacy.accountant, events=[planned])
    spend = (run_ledger if record_level else record_level_ledger(run_ledger)).epsilon()
    load_lifetime(params, dataset).ensure_affordable(
        epsilon=spend.epsilon, delta=spend.delta, what=what,
        basis=f"its planned rounds for one record, by {spend.accountant.upper()}" + (
            "" if record_level else ": one record changes one client"),
        before="its first round")


def spend_of_run(*, run_id: str, flow: str, data_version: str, ledger: Ledger) -> RunSpend:
    summary = ledger.summary()
    return RunSpend(run=run_id, flow=flow, recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    data_version=data_version, epsilon=summary["total"]["epsilon"],
                    delta=summary["total"]["delta"] if ledger.events else 0.0,
                    accountant=summary["total"]["accountant"],
                    stages={stage: spend["epsilon"] for stage, spend in summary["stages"].items()})


def record_lifetime(params: Params, dataset: str, entry: RunSpend) -> LifetimeLedger:
    """Add a finished run to the dataset's ledger (once per run id) and version the file."""
    path = ledger_path(params, dataset)
    with exclusive_lock(path.with_name(f".{path.name}.lock")):  # concurrent runs add one after the other
        ledger = load_lifetime(params, dataset)
        if ledger.record(entry):
            write_text(path, json.dumps(ledger.to_dict(), indent=2) + "\n")
            _version(path)
    return ledger


def _version(path: Path) -> None:
    if not Path(".dvc").is_dir():
        return
    if "DVC_STAGE" in os.environ:  # inside dvc repro, which holds DVC's repository lock
        stage_logger("budget").info("budget: %s written; `make repro` versions it with dvc add after the run", path)
        return
    dvc("add", "--quiet", str(path))


def all_lifetimes(params: Params) -> list[LifetimeLedger]:
    folder = Path(params.lifetime.ledger_dir)
    return [load_lifetime(params, p.stem) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
