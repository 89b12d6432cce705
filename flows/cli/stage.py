"""``privpipe stage NAME [--track]``: one pipeline stage without Prefect, as ``dvc repro`` runs it."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import TYPE_CHECKING, TextIO

from privpipe.config import Params, check_pipeline_use
from tasks import STAGE_MODULES
from tasks.common import one_pipeline_at_a_time, use_torch_threads
from tasks.privacy import budget

if TYPE_CHECKING:  # a type only: the stage modules import torch (seconds), which --help must not wait for
    from tasks.evaluation import Evaluation

__all__ = ["stage"]

SPENDING_STAGES = ("dp_pca", "aggregate", "finetune")  # the stages that add events to the ledger (and prepare's
# schema stage, when it discovers something)


def stage(args: argparse.Namespace) -> int:
    if args.track and args.name != "evaluate":
        raise argparse.ArgumentError(None, "--track: only the evaluate stage can record a run")
    _log_stages_to_stderr()
    from tasks.recipe import load_run_params  # deferred: the data readers, once the arguments are checked

    params = load_run_params(args.params)  # the file's, with a recipe fitted to the data where it writes none
    check_pipeline_use(params)
    from tasks.device import training_device  # deferred: torch, once the params are checked

    training_device(params)  # run.device: cuda on a machine without one is refused before any work
    from tasks.discovery import check_sources, discovery_plan  # deferred: as above

    # prepare spends too when its schema stage discovers what prepare.schema leaves out
    plan = discovery_plan(params) if args.name == "prepare" else None
    with one_pipeline_at_a_time():  # never beside a `privpipe run`, which writes the same artifacts
        if args.name in SPENDING_STAGES or plan is not None:
            # before the reservation: a stage refused here wrote nothing
            if plan is not None:
                check_sources(params, plan)  # what can be checked before the schema's draw
            else:
                _check_inputs(params, args.name)
            # dvc repro: the stages share one reservation of the project, settled at evaluate --track
            budget.reserve_for_stages(params, budget.dataset_name(params), what=f"stage {args.name}")
        use_torch_threads(params, args.name, quiet=True)  # run.torch_threads; the torch-heavy stages say so themselves
        run = getattr(importlib.import_module(STAGE_MODULES[args.name]), f"run_{args.name}")
        out = run(params)
        if args.track:
            _record(params, out, params_file=args.params)
    return 0


def _check_inputs(params: Params, name: str) -> None:
    """A spending stage's inputs, and the checks they and the params decide, before it reserves on the
    lifetime budget (issue 35 point 6): a stage run before the one that writes its input, or one its data
    refuses, fails with one line and leaves no reservation behind."""
    # deferred: the stage modules import torch (seconds)
    from tasks import paths
    from tasks.common import read_json
    from tasks.identity import check_inputs

    where = paths.for_params(params)
    check_inputs(params, where.prepared)  # prepared from the dataset the params name (each stage checks the rest)
    if name == "dp_pca":
        # deferred: each branch imports its own stage's module (torch), only for that stage
        from privpipe.data.records import Records
        from tasks.dp_pca import check_components

        records = Records.load(where.sensitive)
        if params.dp_pca.enabled:
            check_components(params, records.features.shape[1])
    elif name == "aggregate" and params.student.enabled:
        from tasks.privacy.ledger import load_ledger  # deferred: as above, this stage's own module

        check_inputs(params, where.prepared, where.teachers, where.dp_pca)
        load_ledger(where.dp_pca / "ledger.json", params)
        read_json(where.teachers / "summary.json")
    elif name == "finetune" and params.finetune.enabled:
        # deferred: as above, this stage's own modules
        from tasks.finetune.stage import check_lot_size, start_dir
        from tasks.finetune.start import finetune_start

        start = start_dir(params, where)
        check_inputs(params, where.prepared, *dict.fromkeys([where.dp_pca, start]))
        begin = finetune_start(params, sensitive=where.sensitive, dp_pca_dir=where.dp_pca, start=start)
        if params.finetune.mode != "federated":
            check_lot_size(params, len(begin.records))


def _record(params: Params, evaluation: Evaluation, *, params_file: str) -> None:
    # deferred: recording imports MLflow (seconds), which only evaluate --track needs
    from flows.record import record_finished_pipeline

    recorded = record_finished_pipeline(params, evaluation, params_file=params_file)
    print(f"recorded MLflow run {recorded.run.run_id}")
    print(f"MLflow          {recorded.run.url_hint()}")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of each record (not the one at set-up)."""

    @property
    def stream(self) -> TextIO:
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
