"""What privpipe starts ends with it: Prefect's temporary API server dies with the run that started it.

A flow run with no ``PREFECT_API_URL`` makes Prefect start a temporary API server, a uvicorn
child process. A run killed with SIGKILL never stops it: each kill left one such process running
in the project folder. :func:`end_with_us` makes Prefect start it with ``PR_SET_PDEATHSIG``
(Linux): the kernel sends it SIGTERM when the process that started it dies, however it dies.
(``privpipe serve``'s own server is started with the same :func:`stop_with_parent`.)
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Any

__all__ = ["end_with_us", "stop_with_parent"]


def stop_with_parent() -> None:
    """In a child process before it runs (``preexec_fn``): SIGTERM when its parent dies (Linux; elsewhere
    nothing)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class _Subprocess:
    """The ``subprocess`` module as Prefect's server module sees it, but Popen sets the death signal."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, **kwargs: Any) -> subprocess.Popen:
        kwargs.setdefault("preexec_fn", stop_with_parent)
        return subprocess.Popen(*args, **kwargs)


def end_with_us() -> None:
    """Before a flow runs: a temporary Prefect server, if one will be started, ends with this process.
    (The death signal is tied to the thread that starts the server: Prefect's client starts it from
    the thread that runs the flow, which lives as long as the command.)"""
    if os.environ.get("PREFECT_API_URL") or not sys.platform.startswith("linux"):
        return  # a server of the user's, or no prctl: nothing to tie
    import prefect.server.api.server as server  # deferred: a second of imports, paid by the flow anyway

    if not isinstance(server.subprocess, _Subprocess):
        server.subprocess = _Subprocess()  # type: ignore[assignment]  # the module's stand-in, by design
