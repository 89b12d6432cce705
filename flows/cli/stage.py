"""``privpipe stage NAME [--track]``: one pipeline stage without Prefect, as ``dvc repro`` runs it."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from privpipe.config import check_pipeline_use, load_params
from tasks import STAGE_MODULES
from tasks.common import use_torch_threads
from tasks.privacy import budget

__all__ = ["stage"]

SPENDING_STAGES = ("dp_pca", "aggregate", "finetune")  # the stages that add events to the ledger


def stage(args: argparse.Namespace) -> int:
    if args.track and args.name != "evaluate":
        raise argparse.ArgumentError(None, "--track: only the evaluate stage can record a run")
    _log_stages_to_stderr()
    params = load_params(args.params)
    check_pipeline_use(params)
    from tasks.device import training_device  # deferred: torch, once the params are checked

    training_device(params)  # run.device: cuda on a machine without one is refused before any work
    if args.name in SPENDING_STAGES:  # dvc repro: the run is charged at evaluate --track; refuse before spending
        budget.check_lifetime(params, budget.dataset_name(params), what=f"stage {args.name}")
    use_torch_threads(params, args.name, quiet=True)  # run.torch_threads; the torch-heavy stages say so themselves
    run = getattr(importlib.import_module(STAGE_MODULES[args.name]), f"run_{args.name}")
    out = run(params)
    if args.track:
        # deferred: recording imports MLflow (seconds), which only evaluate --track needs
        from flows.record import record_finished_pipeline
        from tasks import tracking

        out = record_finished_pipeline(params, out, params_file=args.params)
        print(f"recorded MLflow run {out['run_id']}")
        print(f"MLflow          {tracking.run_url_hint(params, out['run_id'])}")
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
