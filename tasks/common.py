"""Small I/O helpers shared by the stages: atomic writes, JSON, logging."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from privpipe.data import DataError
from privpipe.files import private_file
from privpipe.locks import exclusive_lock
from tasks import paths
from tasks.identity import MadeFrom, stamp

if TYPE_CHECKING:  # a type only: privpipe.config stays off this module's import path
    from privpipe.config import Params

__all__ = ["write_json", "read_json", "load_array", "save_private_array", "write_text", "staged_dir", "stage_logger",
           "skip_stage", "Skipped", "was_skipped", "seed_for",
           "SEED_STREAMS", "exclusive_lock", "one_at_a_time", "one_pipeline_at_a_time",
           "PipelineBusy", "warn_insecure_rng",
           "INSECURE_STAGE_WARNING", "stage_threads", "task_threads", "use_torch_threads", "apply_torch_threads"]

#: run.seed is split into independent streams, one per use (numpy SeedSequence keys)
SEED_STREAMS = {"dp_pca": 1, "aggregate": 2, "sanitise": 3, "teacher": 4, "student": 5, "head": 6, "removal": 7,
                "federated": 8, "client": 9, "privacy_audit": 10, "finetune_init": 11, "schema": 12}


def write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def staged_dir(target: Path, *, made_from: MadeFrom | None = None) -> Iterator[Path]:
    """Build a stage's output folder under a temporary name; put it in place only once complete.

    On error the temporary folder is removed and ``target`` keeps its previous content, so
    a later stage never reads a model from one run beside a ledger from another. ``made_from``: the
    data it was made from, stamped into it (tasks.identity).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        yield staging
        if made_from is not None:
            stamp(staging, made_from)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    previous = target.with_name(f".{target.name}.previous-{os.getpid()}")
    if target.exists():
        os.replace(target, previous)
    os.replace(staging, target)
    shutil.rmtree(previous, ignore_errors=True)


@contextmanager
def scratch_beside(target: Path) -> Iterator[Path]:
    """A temporary folder beside ``target`` (one file system: what is made in it can be moved into place), removed
    on leaving, with the folders above it it had to make: a refused input leaves no trace."""
    made = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".{target.name}.scratch-*-*"):  # a killed process's (its pid is gone)
        pid = stale.name.rsplit(".scratch-", 1)[1].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.scratch-{os.getpid()}-"))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        for folder in made:  # innermost first; a folder something else wrote into stays
            with suppress(OSError):
                folder.rmdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def seed_for(seed: int, stream: str, *index: int) -> np.random.SeedSequence:
    """The seed of one use of randomness (``stream``, and e.g. a teacher's index) under ``run.seed``."""
    return np.random.SeedSequence([seed, SEED_STREAMS[stream], *index])


class PipelineBusy(RuntimeError):
    """Another run holds the lock on the project's outputs it would write."""


@contextmanager
def one_at_a_time(lock: Path, *, what: str) -> Iterator[None]:
    """Hold the project's ``lock`` for the block, or refuse at once (PipelineBusy): two runs of one kind
    in one project would write the same artifacts."""
    try:
        with exclusive_lock(lock, blocking=False):
            yield
    except BlockingIOError:
        where = f"{lock.resolve()} (the project folder)" if lock.is_dir() else lock
        raise PipelineBusy(f"{where}: {what} is in progress in this project; wait for it (one at a time keeps "
                           "its artifacts consistent)") from None


def one_pipeline_at_a_time() -> AbstractContextManager[None]:
    """The project's pipeline lock: held by ``privpipe run`` for the whole flow, and by each
    ``privpipe stage`` (what dvc repro runs) for its stage."""
    return one_at_a_time(paths.PIPELINE_LOCK, what="another pipeline run (privpipe run, or a stage of dvc repro)")


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_private_array(path: Path, array: np.ndarray) -> None:
    """``np.save`` (the same bytes) into a file of mode 0600: records, their features or their ids
    (:func:`privpipe.files.private_file`)."""
    with private_file(path) as out:
        np.save(out, array)


def load_array(path: Path) -> np.ndarray:
    """``np.load``; a missing file is an earlier stage not run yet (DataError: one line, exit 2)."""
    try:
        return np.load(path)
    except FileNotFoundError:
        raise DataError(f"{path}: missing (run the earlier stages first)") from None


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: missing (run the earlier stages first)") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None


def stage_logger(stage: str) -> logging.Logger | logging.LoggerAdapter:
    """Prefect's run logger inside a flow or task run, else a plain logger (dvc repro)."""
    # deferred: Prefect takes ~1 s to import, and the locks and writers here serve the CLI's quick commands too
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(f"privpipe.{stage}")  # the command line configures its output


#: what a stage logs when it draws noise or sampling coins from a seeded generator
INSECURE_STAGE_WARNING = ("%s: privacy.secure_rng is false: %s from a pseudo-random generator seeded with run.seed, "
                          "so whoever knows the seed can recompute the noise and undo it; fine for experiments, "
                          "not for a release (set privacy.secure_rng: true)")


def _in_prefect_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext  # deferred: see stage_logger

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def warn_insecure_rng(params: Params, stage: str, what: str, *, flow_warns: bool) -> bool:
    """Warn through the stage's logger that ``what`` (e.g. "DP-SGD's noise and lots come") is drawn
    from a seeded generator, when ``privacy.secure_rng`` is false; return whether it warned.

    ``flow_warns``: the flows that run this stage (pipeline, federated) warn once at their start,
    so inside a Prefect run the stage stays quiet; alone (``privpipe stage``, what dvc repro runs)
    it warns itself. A stage that runs in a flow that does not warn (a removal run's retrain)
    passes False.
    """
    if params.privacy.secure_rng or (flow_warns and _in_prefect_run()):
        return False
    stage_logger(stage).warning(INSECURE_STAGE_WARNING, stage, what)
    return True


def _cores() -> int:
    return os.cpu_count() or 1


def stage_threads(params: Params) -> int:
    """Torch's intra-op threads for a stage that runs alone in its process: ``run.torch_threads``
    (0: torch's own default, one per core)."""
    return params.run.torch_threads or _cores()


def task_threads(params: Params) -> int:
    """Torch's threads for each of the mapped tasks that run side by side (teachers, federated clients).

    Local runners (threads, processes, a local Dask or Ray cluster) run ``runner.workers`` tasks at
    once (0: one per core), so each gets at most ``cores // workers`` threads (at least one):
    workers × threads never exceeds the cores. A remote cluster's cores are not known here, so its
    tasks get ``run.torch_threads`` (0: one). The same count applies when the tasks run one after
    another (``privpipe stage``), so both ways give the same results."""
    wanted = params.run.torch_threads
    if params.runner.address:
        return wanted or 1
    workers = params.runner.workers or _cores()
    return max(1, min(wanted or _cores(), _cores() // workers))


def apply_torch_threads(threads: int) -> None:
    """Set torch's intra-op threads. The count is process-wide, but OpenMP applies it per OS thread
    (a thread keeps the count it first ran with): so call it in the thread that computes, every time."""
    import torch  # deferred: torch takes ~1 s to import; the CLI's quick commands use this module

    torch.set_num_threads(threads)


def use_torch_threads(params: Params, stage: str, *, quiet: bool = False) -> int:
    """Apply ``run.torch_threads`` for a stage (at its start) and say so in its log; the count.

    Thread counts change floating-point summation order, so a stage's results are byte-identical
    between runs only at a fixed count. On 2 busy cores torch's default (one thread per core) made
    the student stage 6× slower than one thread (median of 3 runs; up to 16×): OpenMP threads wait
    for each other on cores that other processes hold."""
    threads = stage_threads(params)
    apply_torch_threads(threads)
    if not quiet:
        stage_logger(stage).info("%s: torch uses %d thread(s) (run.torch_threads: %d)", stage, threads,
                                 params.run.torch_threads)
    return threads


@dataclass(frozen=True)
class Skipped:
    """What a switched-off stage returns: its output folder holds only ``skipped.json``, saying why."""

    stage: str
    dir: Path
    reason: str


def skip_stage(stage: str, out: Path, reason: str, *, metrics_file: Path, made_from: MadeFrom) -> Skipped:
    """A switched-off stage still leaves its output folder (stamped) and metrics (saying so), as ``dvc repro``
    expects."""
    with staged_dir(out, made_from=made_from) as staging:
        write_json(staging / "skipped.json", {"stage": stage, "reason": reason})
    write_json(metrics_file, {"skipped": True})
    stage_logger(stage).info("%s: skipped (%s)", stage, reason)
    return Skipped(stage=stage, dir=out, reason=reason)


def was_skipped(metrics_file: Path) -> bool:
    """Whether a stage's last run was switched off (its metrics file says so)."""
    return bool(read_json(metrics_file).get("skipped"))
