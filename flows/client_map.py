"""Client updates as mapped Prefect tasks: one task per sampled client, spread by the task runner.

A client whose task fails is dropped from the round (its update counts as zero). The
server's noise and fixed denominator do not change, so the round's guarantee holds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from prefect import get_run_logger, unmapped
from prefect.task_runners import TaskRunner

from privpipe.federated import ClientUpdates
from tasks.federated.clients import ClientJob, client_update_task

__all__ = ["mapped_client_updates"]


def mapped_client_updates(runner: TaskRunner) -> Callable[[ClientJob], ClientUpdates]:
    """``updates_for`` of the federated trainers: each round's clients as tasks on ``runner``."""
    return lambda job: _updates(job, runner)


def _updates(job: ClientJob, runner: TaskRunner) -> ClientUpdates:
    def updates(round_: int, weights: np.ndarray, sampled: np.ndarray) -> list[np.ndarray | None]:
        if len(sampled) == 0:
            return []
        # Prefect types map() for a task whose result may be a coroutine (R is invariant): a sync task fits at run time
        futures = runner.map(client_update_task, {  # type: ignore[arg-type]
            "job": unmapped(job), "client": [int(k) for k in sampled], "round_": unmapped(round_),
            "weights": unmapped(weights)})
        out: list[np.ndarray | None] = []
        for client, future in zip(sampled, futures):
            future.wait()
            if future.state.is_completed():
                out.append(np.asarray(future.result()))
            else:
                get_run_logger().warning("round %d: client %d dropped (%s)", round_, int(client),
                                         future.state.message or future.state.name)
                out.append(None)
        return out
    return updates
