"""The lifetime privacy budget of each dataset, on disk: ``<lifetime.ledger_dir>/<dataset>.json``.

    privpipe budget                  # what each dataset has spent, what is held, what is left
    privpipe budget --release ID     # a person's word that a run which died released nothing

A run is admitted by a **reservation**: under the ledger's lock, :func:`admitted` records the
most it may spend (``privacy.epsilon_budget``, ``privacy.delta``) as a pending entry in
``.<dataset>.reservations.json`` beside the ledger, refused (LifetimeBudgetExceeded) if the
recorded runs and every other reservation leave too little. Runs started at the same moment,
in one project or in several that share ``lifetime.ledger_dir``, so never pass the budget
together: each is checked against what the others hold, not only what they have charged.
A client-level run (the federated text flow) costs more per record than its own budget, so
once its rounds are planned it resizes its reservation to their record-level cost
(:meth:`Admission.resize`). When the run has released its model, :meth:`Admission.charge`
replaces the reservation with what it actually spent, record-level. A run that ends without
spending releases its reservation, and so does one that fails before its first figure computed from
the sensitive records leaves (a crash while DP-SGD trains: DP-PCA's σ and ε, which the params decide,
are no such figure); one that fails after it may have released private output (the noisy votes'
answers, a model's figures in MLflow, a round's accuracy in the logs) is charged its reservation, an
upper bound of what it released, so that nothing leaves a run uncharged.
A run that was killed cannot do either: the next update of the ledger drops its
reservation if its process is gone and it never released anything, and otherwise keeps it
counted (over-count, never under-count) until a person says otherwise
(``privpipe budget --release``). ``dvc repro`` runs each stage in its own process, so its
spending stages share one reservation per project (:func:`reserve_for_stages`), settled by
``privpipe stage evaluate --track``.

The ledger file lives with the data and is versioned by DVC (``dvc add`` after each charge,
when the project is a DVC repository and we are not inside ``dvc repro``, which holds DVC's
lock: ``make repro`` adds it afterwards); the reservations are not: they say what is in
progress, not what was spent.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from privpipe.config import Params
from privpipe.data import DataError
from privpipe.files import read_user_text
from privpipe.privacy import Event, Ledger, LifetimeLedger, Reservation, RunSpend, record_level_ledger
from tasks.common import exclusive_lock, stage_logger, write_text
from tasks.versioning import dvc

__all__ = ["dataset_name", "ledger_path", "load_lifetime", "check_lifetime", "admitted", "Admission",
           "reserve_for_stages", "charge_stages", "release_reservation", "holder_gone", "spend_of_run",
           "all_lifetimes"]


def dataset_name(params: Params, *, flow: str = "pipeline") -> str:
    """One ledger per dataset: the data file's (or folder's) name without suffix, e.g. ``digits``."""
    if flow == "federated-text":
        return "20newsgroups" if params.text.format == "20newsgroups" else Path(params.text.path).stem
    return Path(params.prepare.path).stem


def ledger_path(params: Params, dataset: str) -> Path:
    return Path(params.lifetime.ledger_dir) / f"{dataset}.json"


def reservations_path(params: Params, dataset: str) -> Path:
    return Path(params.lifetime.ledger_dir) / f".{dataset}.reservations.json"


def load_lifetime(params: Params, dataset: str) -> LifetimeLedger:
    """The dataset's ledger with the runs in progress (empty if it has none yet); DataError naming the
    file if it is damaged, or the folder if it is not one (a check that cannot read its ledger refuses)."""
    path, held = ledger_path(params, dataset), reservations_path(params, dataset)
    _check_folder(path.parent)
    budgets = {"epsilon_budget": params.lifetime.epsilon_budget, "delta_budget": params.lifetime.delta_budget}
    entries = _read(path, lambda raw: LifetimeLedger.from_dict(raw, **budgets).entries,
                    f"damaged lifetime ledger ({{}}); restore it with `dvc checkout {path}`")
    reservations = _read(held, LifetimeLedger.reservations_from_dict,
                         "damaged reservations file ({}); its runs in progress cannot be counted, so no run is "
                         "admitted until it is repaired or removed (runs still holding a reservation then go "
                         "uncounted: check `ps` first)")
    return LifetimeLedger(dataset=dataset, entries=entries, reservations=reservations, **budgets)


def _check_folder(folder: Path) -> None:
    """The ledger folder must be one this process can write (or create): a check that could read but not
    record would let runs through that are never charged."""
    if folder.exists() and not folder.is_dir():
        raise DataError(f"{folder}: lifetime.ledger_dir is not a directory")
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise DataError(f"{existing}: not writable, so lifetime.ledger_dir ({folder}) cannot record a charge")


def _read(path: Path, parse, problem: str) -> list:
    if not path.exists():
        return []
    text = read_user_text(path, error=DataError)  # a folder in its place, a permission: one line, never "empty"
    try:
        return parse(json.loads(text))
    except (json.JSONDecodeError, ValueError) as exc:
        raise DataError(f"{path}: {problem.format(exc)}") from None


def check_lifetime(params: Params, dataset: str, *, what: str, private: bool = True,
                   client_level: bool = False) -> LifetimeLedger:
    """Refuse (LifetimeBudgetExceeded) a run whose budget the dataset can no longer pay, reserving
    nothing: the command line's quick check before it starts Prefect; :func:`admitted` reserves."""
    ledger = load_lifetime(params, dataset)
    epsilon, delta, basis = _most(params, private=private, client_level=client_level)
    ledger.ensure_affordable(epsilon=epsilon, delta=delta, what=what if private else f"{what} (not private)",
                             basis=basis)
    return ledger


def _most(params: Params, *, private: bool, client_level: bool) -> tuple[float, float, str]:
    """The most a run may spend before it is planned, and where that comes from."""
    if not private:  # a non-private model of the data has no finite ε: it would end the dataset's budget
        return float("inf"), 0.0, "no clipping, no noise"
    return params.privacy.epsilon_budget, params.privacy.delta, (
        "privacy.epsilon_budget, client-level: one record costs more, checked before the first round"
        if client_level else "privacy.epsilon_budget, privacy.delta")


# -- the ledger under its lock ------------------------------------------------------------------------


@contextmanager
def _updating(params: Params, dataset: str) -> Iterator[LifetimeLedger]:
    """The dataset's ledger under its lock, for one read-modify-write; what changed is written back
    when the block ends without error: the charges first (and versioned), then the reservations, so
    that a crash between the two leaves a reservation beside its own charge, which the next update
    drops (:meth:`LifetimeLedger.drop_settled`), never a charge without its cost counted."""
    path = ledger_path(params, dataset)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise DataError(f"{path.parent}: lifetime.ledger_dir is not a directory") from None
    with exclusive_lock(path.with_name(f".{path.name}.lock")):  # every run's update, one after the other
        ledger = load_lifetime(params, dataset)
        entries, held = list(ledger.entries), list(ledger.reservations)
        _reap(ledger)
        yield ledger
        if ledger.entries != entries:
            write_text(path, json.dumps(ledger.to_dict(), indent=2) + "\n")
            _version(path)
        if ledger.reservations != held:
            write_text(reservations_path(params, dataset), json.dumps(ledger.reservations_to_dict(), indent=2) + "\n")


def _reap(ledger: LifetimeLedger) -> None:
    """Drop what no run holds any longer: reservations already charged, and those of processes that
    are gone without having released anything (they spent nothing)."""
    log = stage_logger("budget")
    for gone in ledger.drop_settled():
        log.info("budget: reservation %s was charged already; dropped", gone.run)
    for reservation in list(ledger.reservations):
        if not reservation.published and holder_gone(reservation.holder):
            ledger.release(reservation.run)
            log.warning("budget: dropped reservation %s of dataset %r: its run (process %s on %s) ended before it "
                        "released anything", reservation.run, ledger.dataset, reservation.holder.get("pid"),
                        reservation.holder.get("host"))


def _this_process() -> dict[str, Any]:
    return {"kind": "process", "host": socket.gethostname(), "pid": os.getpid(), "started": _started(os.getpid()),
            "project": str(Path.cwd().resolve())}


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), which tells a reused pid apart."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]  # a zombie has ended: only its parent has not reaped it


def holder_gone(holder: dict[str, Any]) -> bool:
    """Whether the process that holds a reservation has certainly ended: only a process on this host can
    be told; a dvc repro's reservation (no process lives across its stages) never is."""
    if holder.get("kind") != "process" or holder.get("host") != socket.gethostname():
        return False
    pid = int(holder["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    started = _started(pid)
    if started is None:  # on Linux a zombie (ended, its parent has not reaped it); elsewhere nothing to tell by
        return Path("/proc").is_dir()
    return holder.get("started") is not None and started != holder["started"]  # the pid now names another


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- a run's admission, from reservation to charge --------------------------------------------------------


class Admission:
    """One run's hold on its dataset's lifetime budget: made by :func:`admitted`, resized once the run
    is planned, marked when it first releases private output, replaced by its charge."""

    def __init__(self, params: Params, dataset: str, reservation: Reservation, *, what: str) -> None:
        self.params, self.dataset, self.what = params, dataset, what
        self.reservation = reservation
        self.charged = False

    def resize(self, *, epsilon: float, delta: float, basis: str, before: str) -> None:
        """Hold (ε, δ) instead, the run's planned cost; refused if the budget cannot pay it beside the others."""
        resized = replace(self.reservation, epsilon=epsilon, delta=delta, basis=basis)
        with _updating(self.params, self.dataset) as ledger:
            ledger.reserve(resized, what=self.what, before=before)
        self.reservation = resized

    def mark_published(self) -> None:
        """Private output is about to leave the process: from now on only a charge or a person drops the
        reservation (a run that dies later may have released up to all of it)."""
        if self.reservation.published:
            return
        marked = replace(self.reservation, published=True)
        with _updating(self.params, self.dataset) as ledger:
            if ledger.reservation(marked.run) is None:
                raise DataError(f"{ledger_path(self.params, self.dataset)}: the reservation of this run "
                                f"({marked.run}) was released by hand while it ran; stopping before it releases "
                                "anything")
            ledger.reservations = [marked if r.run == marked.run else r for r in ledger.reservations]
        self.reservation = marked

    def charge(self, entry: RunSpend) -> LifetimeLedger:
        """Replace the reservation with what the run spent (once per run id)."""
        entry = replace(entry, reservation=self.reservation.run)
        with _updating(self.params, self.dataset) as ledger:
            ledger.settle(entry, what=self.what)
        self.charged = True
        return ledger

    def end(self) -> None:
        """The run is over: a charged run holds nothing; one that released nothing gives its reservation
        back; one that may have released something is charged its reservation, the most it could have
        spent (what it did release is not known stage by stage: a stage may fail while it logs)."""
        if self.charged:
            return
        with _updating(self.params, self.dataset) as ledger:
            if not self.reservation.published:
                ledger.release(self.reservation.run)
                return
            held = self.reservation
            ledger.settle(RunSpend(run=held.run, flow=f"{held.flow} (failed)", recorded_at=_now(),
                                   data_version="", epsilon=held.epsilon, delta=held.delta,
                                   accountant="its reservation (an upper bound)", reservation=held.run),
                          what=self.what)
        stage_logger("budget").warning(
            "budget: the run failed after it may have released private output: dataset %r is charged its "
            "reservation, ε = %.4g, δ = %g (%s)", self.dataset, held.epsilon, held.delta, held.run)


@contextmanager
def admitted(params: Params, dataset: str, *, what: str, flow: str, private: bool = True,
             client_level: bool = False) -> Iterator[Admission]:
    """Reserve the most the run may spend before any work, for the block; refused
    (LifetimeBudgetExceeded, nothing held) if the dataset cannot pay it beside what others hold."""
    if not private:  # no finite ε to reserve: refused as the command line's check refuses it
        check_lifetime(params, dataset, what=what, private=False)
    epsilon, delta, basis = _most(params, private=True, client_level=client_level)
    reservation = Reservation(run=f"{flow}-{uuid.uuid4().hex[:12]}", flow=flow, reserved_at=_now(), epsilon=epsilon,
                              delta=delta, basis=basis, holder=_this_process())
    with _updating(params, dataset) as ledger:
        ledger.reserve(reservation, what=what)
    admission = Admission(params, dataset, reservation, what=what)
    try:
        yield admission
    finally:
        admission.end()


def planned_cost(params: Params, planned: Event, *, record_level: bool,
                 unit: str = "rounds") -> tuple[float, float, str]:
    """(ε, δ, basis) of a run's planned event (its ``unit``: rounds or steps) for one record: as it is (client
    noise, DP-SGD), or in its record-level form (privpipe.privacy.group) when it is client-level."""
    run_ledger = Ledger(epsilon_budget=params.privacy.epsilon_budget, delta=params.privacy.delta,
                        accountant=params.privacy.accountant, events=[planned])
    spend = (run_ledger if record_level else record_level_ledger(run_ledger)).epsilon()
    basis = f"its planned {unit} for one record, by {spend.accountant.upper()}" + (
        "" if record_level else ": one record changes one client")
    return spend.epsilon, spend.delta, basis


# -- dvc repro: one reservation per project, across the stages' processes ---------------------------------


def _repro_holder() -> dict[str, Any]:
    return {"kind": "repro", "host": socket.gethostname(), "project": str(Path.cwd().resolve())}


def _repro_reservation(ledger: LifetimeLedger) -> Reservation | None:
    holder = _repro_holder()
    return next((r for r in ledger.reservations if r.holder == holder), None)


def reserve_for_stages(params: Params, dataset: str, *, what: str) -> Reservation:
    """A spending stage outside Prefect (``privpipe stage``, as dvc repro runs it): hold the project's
    stage reservation (the one an earlier stage made, else a new one of ``privacy.epsilon_budget``).
    Its stages write their figures as they go, so it counts as released from the start; the
    evaluate stage's ``--track`` settles it (:func:`charge_stages`)."""
    with _updating(params, dataset) as ledger:
        held = _repro_reservation(ledger)
        if held is None:
            epsilon, delta, basis = _most(params, private=True, client_level=False)
            held = Reservation(run=f"dvc-repro-{uuid.uuid4().hex[:12]}", flow="dvc-repro", reserved_at=_now(),
                               epsilon=epsilon, delta=delta, basis=basis, holder=_repro_holder(), published=True)
            ledger.reserve(held, what=what)
    return held


def charge_stages(params: Params, dataset: str, entry: RunSpend, *, what: str) -> LifetimeLedger:
    """Settle the project's stage reservation with what the stages spent; without one (every spending
    stage came from DVC's cache), charge it as a reservation would have been: refused if it cannot pay."""
    with _updating(params, dataset) as ledger:
        held = _repro_reservation(ledger)
        ledger.settle(replace(entry, reservation=held.run if held else ""), what=what)
    return ledger


def release_reservation(params: Params, run: str) -> tuple[str, Reservation]:
    """A person's word that a run which holds a reservation released nothing: drop it. Refused
    (DataError) while its process is alive, and for a reservation that does not exist."""
    folder = Path(params.lifetime.ledger_dir)
    for dataset in _datasets_with_reservations(folder):
        held = reservations_path(params, dataset)
        with _updating(params, dataset) as ledger:
            reservation = ledger.reservation(run)
            if reservation is None:
                continue
            holder = reservation.holder
            if holder.get("kind") == "process" and holder.get("host") == socket.gethostname() \
                    and not holder_gone(holder):
                raise DataError(f"{held}: reservation {run} is held by process {holder['pid']}, which is still "
                                "running; it releases its reservation itself when it ends")
            ledger.release(run)
            return dataset, reservation
    raise DataError(f"{folder}: no reservation {run!r} on any dataset (`privpipe budget` lists them)")


def spend_of_run(*, run_id: str, flow: str, data_version: str, ledger: Ledger) -> RunSpend:
    summary = ledger.summary()
    return RunSpend(run=run_id, flow=flow, recorded_at=_now(), data_version=data_version,
                    epsilon=summary["total"]["epsilon"], delta=summary["total"]["delta"] if ledger.events else 0.0,
                    accountant=summary["total"]["accountant"],
                    stages={stage: spend["epsilon"] for stage, spend in summary["stages"].items()})


def _version(path: Path) -> None:
    if not Path(".dvc").is_dir():
        return
    if not path.resolve().is_relative_to(Path.cwd().resolve()):  # `dvc add` refuses a file outside the repo
        stage_logger("budget").info("budget: %s is outside this project, so its DVC does not version it", path)
        return
    if "DVC_STAGE" in os.environ:  # inside dvc repro, which holds DVC's repository lock
        stage_logger("budget").info("budget: %s written; `make repro` versions it with dvc add after the run", path)
        return
    dvc("add", "--quiet", str(path))


def all_lifetimes(params: Params) -> list[LifetimeLedger]:
    folder = Path(params.lifetime.ledger_dir)
    if not folder.is_dir():
        return []
    datasets = {p.stem for p in folder.glob("*.json") if not p.name.startswith(".")}
    return [load_lifetime(params, dataset) for dataset in sorted(datasets | set(_datasets_with_reservations(folder)))]


def _datasets_with_reservations(folder: Path) -> list[str]:
    """The datasets that have a reservations file in ``folder`` (``.<dataset>.reservations.json``)."""
    suffix = ".reservations.json"
    return sorted(p.name[1:-len(suffix)] for p in folder.glob(f".*{suffix}")) if folder.is_dir() else []
