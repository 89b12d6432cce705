"""runner: where mapped tasks (teachers, federated clients) run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.errors import one_of, require
from privpipe.config.ranges import Range, at_least

RUNNERS = ("threads", "processes", "dask", "ray")


@dataclass(frozen=True)
class RunnerConfig:
    #: threads | processes (this machine) | dask (prefect-dask) | ray (prefect-ray, `pip install -e '.[ray]'`)
    kind: str = "threads"  # needs no extra process or package
    #: threads, processes or a local dask cluster's workers (0 = one per core)
    workers: int = 0  # one per core
    #: dask: scheduler address (tcp://host:8786); ray: cluster address (ray://host:10001); null = start a local one
    address: str | None = None  # start a local cluster rather than assume one exists

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {"workers": at_least(0, 4096)}


def check(runner: RunnerConfig) -> None:
    one_of(runner.kind, RUNNERS, "runner.kind")
    require(runner.workers >= 0, "runner.workers", "must be >= 0 (0 = one per core)")
    require(runner.address is None or runner.kind in ("dask", "ray"), "runner.address",
            f"only a dask or ray runner connects to an address (runner.kind is {runner.kind})")
