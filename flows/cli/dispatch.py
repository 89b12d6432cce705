"""``main``: parse the command line, run the command, turn its expected failures into exit codes."""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from typing import Callable, Sequence

from flows.cli.app import build_parser
from flows.cli.exits import exit_for

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``privpipe ARGS``: the exit code (argparse itself exits 2 on a malformed command line)."""
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            return _command(args.runs)(args)
    except Exception as exc:
        outcome = exit_for(exc)
        if outcome is None:
            raise
        print(f"{outcome.prefix}{exc}", file=sys.stderr)
        return outcome.code


def _command(runs: str) -> Callable[[argparse.Namespace], int]:
    """The function app.py registered as ``module:function``."""
    module, function = runs.split(":")
    # imported only now: a command's module may pull in Prefect, MLflow or torch (seconds), which
    # `privpipe --help`, a mistyped option or another command must not wait for
    return getattr(importlib.import_module(module), function)
