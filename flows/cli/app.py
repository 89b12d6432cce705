"""The ``privpipe`` command line: every command and its options, registered here.

    privpipe run [--params params.yaml]          the pipeline as a Prefect flow, tracked in MLflow
    privpipe stage NAME [--params ...] [--track] one stage alone (what dvc repro calls); NAME is one of prepare
                                                 partition dp_pca teachers aggregate student finetune head evaluate
    privpipe federated [--params params.yaml]    text classification with DP: federated (client-level) or central DP-SGD
    privpipe init-data                           write the embedded default data (digits) if missing
    privpipe forget ID... [--reason TEXT]        queue deletion requests (durable; unknown ids are refused)
    privpipe removals [--params ...]             process the queue as a Prefect flow (remove, register, new data
                                                 version)
    privpipe requests [--record ID] [--redact] [--params ...]   list a dataset's deletion requests and their state
    privpipe serve [--params ...] [--use-running-server]   the Prefect deployments: scheduled retraining, deletion
                                                           processing
    privpipe budget [--release ID] [--params ...]  each dataset's lifetime privacy spend, run by run
    privpipe audit [--params ...] [--dataset D] [--since DAY] [--until DAY] [--csv FILE]   the recorded runs
    privpipe privacy dpsgd --noise-multiplier 1.1 --sample-rate 0.01 --steps 10000 --delta 1e-5

Bad input ends with one line on stderr naming the key or file, and exit code 2; a run that
another holds the lock for, or a refused budget, with one line and exit code 1; a privacy audit
that contradicts the claimed ε (a bug: the model is not registered) with exit code 3. Anything
else is a bug and shows its traceback (exit code 1). The table: flows/cli/exits.py.

Each command names the function that runs it as ``module:function``; flows/cli/dispatch.py imports
that module only when the command runs, so ``privpipe --help`` and argument errors need none of them.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from flows.cli.arguments import model_ref, noise_multiplier, positive_float, step_count
from flows.cli.exits import ERROR, clip_values
from tasks import STAGE_MODULES

__all__ = ["build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors end like every other: ``privpipe: error: …`` (a subcommand's parser,
    ``privpipe privacy dpsgd``, would start its line with its own name), the values in it cut
    (:func:`flows.cli.exits.clip_values`); its usage first, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{ERROR}{clip_values(message)}\n")


def _command(commands: argparse._SubParsersAction, name: str, runs: str, help: str) -> argparse.ArgumentParser:
    """Register ``name``, run by the function ``runs`` (``module:function``)."""
    parser = commands.add_parser(name, help=help)
    parser.set_defaults(runs=runs)
    return parser


def _params_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")


def build_parser() -> argparse.ArgumentParser:
    # its subcommands' parsers are of its class (add_subparsers' default)
    parser = _Parser(prog="privpipe", description="Privacy-preserving ML pipeline.")
    commands = parser.add_subparsers(dest="command", required=True)

    run = _command(commands, "run", "flows.cli.flow_runs:run", "run the whole pipeline as a Prefect flow")
    _params_option(run)

    stage = _command(commands, "stage", "flows.cli.stage:stage",
                     "run one stage without Prefect (dvc repro uses this)")
    stage.add_argument("name", choices=tuple(STAGE_MODULES), help="the stage, as dvc.yaml names it")
    _params_option(stage)
    stage.add_argument("--track", action="store_true",
                       help="evaluate only: record the finished pipeline's outputs as an MLflow run")

    federated = _command(commands, "federated", "flows.cli.flow_runs:federated",
                         "text classification with DP: federated with client-level DP (text and federated sections "
                         "of the params file), or central DP-SGD with text.training: dpsgd (text and finetune "
                         "sections)")
    _params_option(federated)

    init = _command(commands, "init-data", "flows.cli.init_data:init_data",
                    "write the embedded default dataset under data/raw if missing")
    _params_option(init)

    schema = _command(commands, "schema", "flows.cli.schema:schema",
                      "discover what prepare.schema leaves out (bounds, categories, labels) with DP, charged to the "
                      "dataset's lifetime budget, and print it as a schema to review and commit")
    _params_option(schema)

    predict = _command(commands, "predict", "flows.cli.predict:predict",
                       "score a table (CSV, Parquet) or an image folder with a registered model: the team's raw "
                       "records in, label names and class probabilities out")
    predict.add_argument("--model", required=True, type=model_ref, metavar="NAME[/VERSION]",
                         help="the registered model and its version (default: the latest)")
    predict.add_argument("--input", required=True, metavar="FILE",
                         help="a CSV or Parquet file with the model's columns, or a folder of PNG/JPEG images")
    predict.add_argument("--output", required=True, metavar="FILE",
                         help="where the scores go (.csv or .parquet): the input's other columns, label, probability, "
                              "p_<class>")
    _params_option(predict)

    forget = _command(commands, "forget", "flows.cli.erasure:forget",
                      "queue deletion requests for records (by record id)")
    forget.add_argument("record_ids", nargs="+", metavar="RECORD_ID",
                        help="a record's id in the current data (e.g. digits-0001)")
    forget.add_argument("--reason", default=None, help="why; the queue keeps only its HMAC (so whoever holds the "
                                                       "reason can check it), MLflow nothing")
    _params_option(forget)

    removals = _command(commands, "removals", "flows.cli.erasure:removals",
                        "process the pending deletion requests (Prefect flow)")
    _params_option(removals)

    requests = _command(commands, "requests", "flows.cli.erasure:requests", "list deletion requests and their state")
    requests.add_argument("--record", default=None, metavar="RECORD_ID",
                          help="only the requests for this record id (matched by its hash)")
    requests.add_argument("--redact", action="store_true",
                          help="rewrite requests an older privpipe journaled with the raw record id and reason, "
                               "keeping only their hashes")
    _params_option(requests)

    serve = _command(commands, "serve", "flows.cli.serving:serve",
                     "serve the scheduled-retrain and deletion-processing deployments (starts a local Prefect server "
                     "if none answers; its log: PREFECT_HOME/server.log)")
    _params_option(serve)
    serve.add_argument("--list", action="store_true", help="only print the deployments and their schedules")
    serve.add_argument("--use-running-server", action="store_true",
                       help="serve on the Prefect server answering at schedule.prefect_api_url even when it is not "
                            "this project's (its PREFECT_HOME differs or is unknown); refused without this flag")

    budget = _command(commands, "budget", "flows.cli.history:budget",
                      "each dataset's lifetime privacy spend, the runs in progress and what is left")
    budget.add_argument("--params", default=None,
                        help="only the datasets this params file names (default: every dataset, with params.yaml's "
                             "lifetime settings)")
    budget.add_argument("--release", default=None, metavar="RESERVATION",
                        help="drop the reservation of a run that ended without releasing anything (your word for "
                             "it: a run that died after it released output keeps its reservation counted until "
                             "then); refused while its process runs")

    audit = _command(commands, "audit", "flows.cli.history:audit",
                     "the recorded runs (from MLflow): data version, ε per stage, accuracy, model version")
    audit.add_argument("--params", default=None,
                       help="only the runs of this params file's experiment and dataset (default: every experiment's "
                            "runs, in the store params.yaml names)")
    audit.add_argument("--dataset", default=None, help="only runs on this dataset (e.g. digits)")
    audit.add_argument("--since", default=None, help="only runs started on or after this day (YYYY-MM-DD, UTC)")
    audit.add_argument("--until", default=None, help="only runs started before this day (YYYY-MM-DD, UTC)")
    audit.add_argument("--csv", default=None, metavar="FILE", help="also write the table as CSV")

    privacy = commands.add_parser("privacy", help="privacy calculators")
    calculators = privacy.add_subparsers(dest="calculator", required=True)
    dpsgd = _command(calculators, "dpsgd", "flows.cli.calculator:dpsgd",
                     "ε of DP-SGD (Poisson-subsampled Gaussian) for given σ, q, T, δ")
    dpsgd.add_argument("--noise-multiplier", type=noise_multiplier, required=True, help="σ, at most 1e6")
    dpsgd.add_argument("--sample-rate", type=positive_float, required=True,
                       help="q, the Poisson sampling rate (≈ lot size / n), at most 1")
    dpsgd.add_argument("--steps", type=step_count, required=True, help="T")
    dpsgd.add_argument("--delta", type=positive_float, required=True, help="δ, below 1")
    dpsgd.add_argument("--accountant", default="best", metavar="NAME",
                       help="one that privacy.accountant accepts (default best: the smaller ε of PLD and RDP, and "
                            "which one it is); another is refused naming them")
    return parser
