"""``main``: parse the command line, run the command, turn its expected failures into exit codes."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence

from flows.cli.app import build_parser
from flows.cli.exits import clip_values, exit_for

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``privpipe ARGS``: the exit code (argparse itself exits 2 on a malformed command line). As the
    command itself (``argv`` None) the process ends, once the normal exit has done its work, without the
    interpreter's teardown: see :class:`_Leave`."""
    if argv is not None:
        return _run(argv)
    leave = _Leave()
    atexit.register(leave)  # before the command registers anything (Prefect does): so it runs last
    try:
        leave.code = _run(None)
    except BaseException:
        # a bug's traceback, Ctrl-C, argparse's own exit: the interpreter's normal exit, teardown and all
        atexit.unregister(leave)
        raise
    return leave.code


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
        print(f"{outcome.prefix}{clip_values(str(exc))}", file=sys.stderr)
        return outcome.code


class _Leave:
    """The privpipe command's first atexit handler, so its last: it ends the process with ``code`` (what
    :func:`main` returned) before the interpreter's teardown. After a run, freeing what torch, Prefect and
    MLflow hold took seconds, and a scheduled retrain or a script waited for it.

    Everything else a normal exit does has happened by then, in the interpreter's own order: threading's
    shutdown (thread pools told to stop, then every non-daemon thread joined), then the atexit handlers
    registered after this one, last first (Prefect stops its temporary server and sends its last logs).
    This one then shuts logging down and flushes stdout and stderr. A handler registered before main would
    not run: the one the console script and ``python -m flows.cli`` register is logging's own (this module
    imports logging), which is why this one calls it (tests/commands/test_cli_exit_codes.py checks there is no other).
    (privpipe's own files are written and closed before main returns.)"""

    def __init__(self) -> None:
        self.code = 1  # Python's own for a failure; main sets the command's before any exit can come here

    def __call__(self) -> None:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
                stream.flush()
        os._exit(self.code)


def _command(runs: str) -> Callable[[argparse.Namespace], int]:
    """The function app.py registered as ``module:function``."""
    module, function = runs.split(":")
    # imported only now: a command's module may pull in Prefect, MLflow or torch (seconds), which
    # `privpipe --help`, a mistyped option or another command must not wait for
    return getattr(importlib.import_module(module), function)
