"""Client updates as mapped Prefect tasks: one task per sampled client, spread by the task runner.

A client whose task fails is dropped from the round (its update counts as zero). The
server's noise and fixed denominator do not change, so the round's guarantee holds.
"""

from __future__ import annotations

import numpy as np
from prefect import get_run_logger, unmapped

from privpipe.federated import ClientUpdates
from tasks.federated_clients import ClientJob, client_update_task

__all__ = ["mapped_client_updates"]


def mapped_client_updates(job: ClientJob) -> ClientUpdates:
    def updates(round_: int, weights: np.ndarray, sampled: np.ndarray) -> list[np.ndarray | None]:
        futures = client_update_task.map(unmapped(job), [int(k) for k in sampled], unmapped(round_),
                                         unmapped(weights))
        out: list[np.ndarray | None] = []
        for client, future in zip(sampled, futures):
            future.wait()
            if future.state.is_completed():
                out.append(future.result())
            else:
                get_run_logger().warning("round %d: client %d dropped (%s)", round_, int(client),
                                         future.state.message or future.state.name)
                out.append(None)
        return out
    return updates
