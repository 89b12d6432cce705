"""Run the removal flow and SIGKILL this process at one step (used by tests/stages/removal/test_crash_recovery.py).

    python tests/crash_removals.py STEP     # in a project folder; STEP is one of STEPS

The kill is injected here, by wrapping the step's function, so the product code carries no
fault-injection hooks. A real SIGKILL: no ``finally``, no ``atexit``, no flushing — what a
power cut or the OOM killer leaves behind.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

#: step → (module, attribute, when): kill right after the function returns, or just before it runs
STEPS: dict[str, tuple[str, str, str]] = {
    "queue": ("flows.removals", "_next_batch", "after"),  # the batch is announced in the journal, no work yet
    "apply": ("tasks.removal.steps", "apply_batch", "after"),  # the Newton update is in artifacts/digits/head
    "register": ("tasks.removal.steps", "register_batch", "after"),  # the new head version is registered
    "erase": ("tasks.removal.steps", "erase_batch", "after"),  # the new data version is written (and dvc-added)
    "mark_done": ("privpipe.requests.queue", "RequestQueue.mark_done", "before"),  # all done but the journal
}


def _die() -> None:
    sys.stderr.write("crash_removals: SIGKILL\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _wrap(original: Callable[..., Any], when: str) -> Callable[..., Any]:
    @wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if when == "before":
            _die()
        result = original(*args, **kwargs)
        _die()
        return result  # not reached

    return wrapper


def inject(step: str) -> None:
    import importlib

    module_name, attribute, when = STEPS[step]
    owner: Any = importlib.import_module(module_name)
    *parents, name = attribute.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    setattr(owner, name, _wrap(getattr(owner, name), when))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in STEPS:
        print(f"usage: crash_removals.py {{{','.join(STEPS)}}}", file=sys.stderr)
        return 2
    inject(argv[0])
    from flows.cli import main as cli

    cli(["removals"])
    print("crash_removals: the flow finished without reaching the step", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
