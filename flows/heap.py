"""Garbage collection around a command's flow run (``privpipe run``, ``privpipe federated``).

A command imports Prefect, MLflow and torch (millions of objects that live as long as the process, and
almost no garbage). Each full collection scans every object, and the heap's growth set one off at each
quarter it grew: 10 of them, 1.7 s of a default run (gc.callbacks), scanning the same modules again. So,
inside :func:`command`: the big imports run with collection off (:func:`importing`) and are frozen out of
later collections, and each stage's end (:func:`settle_heap`, from the flow's stage clock) collects the
stage's garbage and freezes what it left alive. When the command ends, everything is unfrozen: a process
that goes on (a test session, a program calling the CLI) keeps Python's collector as it was. A flow run
outside a command (a deployment's run, a test calling a flow) is left alone.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["command", "importing", "settle_heap"]

_in_command = False  # inside command(): what settle_heap needs to know


@contextmanager
def command() -> Iterator[None]:
    """One command's run: the heap settled at each stage's end, and unfrozen at the end."""
    global _in_command
    outer = _in_command
    _in_command = True
    try:
        yield
    finally:
        _in_command = outer
        if not outer:
            gc.unfreeze()


@contextmanager
def importing() -> Iterator[None]:
    """Around a command's big imports: no collection while they run, and what they made frozen after (inside
    :func:`command` only; elsewhere collection is merely paused)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        if _in_command:
            gc.freeze()


def settle_heap() -> None:
    """At a stage's end, inside :func:`command`: the stage's garbage collected, and what it left alive frozen, so
    the later stages' full collections scan only what they make, not torch's compiler (imported by the first
    optimizer) or MLflow's model code again (0.3 s of a default run). Elsewhere nothing."""
    if _in_command:
        gc.collect()
        gc.freeze()
