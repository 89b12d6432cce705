"""``main``: parse the command line, run the command, turn its expected failures into exit codes."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import NoReturn

from flows.cli.app import build_parser
from flows.cli.exits import exit_for

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``privpipe ARGS``: the exit code (argparse itself exits 2 on a malformed command line). As the
    command itself (``argv`` None) the process then ends at once: see :func:`_leave`."""
    code = _run(argv)
    if argv is None:
        _leave(code)
    return code


def _run(argv: Sequence[str] | None) -> int:
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


def _leave(code: int) -> NoReturn:
    """End the process as the interpreter would, without its teardown: after a run, freeing what torch,
    Prefect and MLflow hold took seconds, and a scheduled retrain or a script waited for it.
    What a normal exit does first is done here too, in its order: threading's own shutdown (thread pools
    told to stop, then every non-daemon thread joined; joining first would wait forever on an idle pool's
    workers), the atexit handlers (Prefect stops its temporary server and sends its last logs, logging
    flushes its files), stdout and stderr flushed. (privpipe's own files are written and closed before.)"""
    threading._shutdown()  # what the interpreter calls first on exit (CPython; private, no public twin)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
            stream.flush()
    os._exit(code)


def _command(runs: str) -> Callable[[argparse.Namespace], int]:
    """The function app.py registered as ``module:function``."""
    module, function = runs.split(":")
    # imported only now: a command's module may pull in Prefect, MLflow or torch (seconds), which
    # `privpipe --help`, a mistyped option or another command must not wait for
    return getattr(importlib.import_module(module), function)
