"""partition: split the sensitive set into disjoint shards, one per teacher.

    privpipe stage partition        # what dvc repro runs

Each record's shard depends only on the seed, its id and its label (see
:mod:`privpipe.data.partition`), so adding or removing one record changes one shard:
the adjacency PATE's analysis assumes. The assignment is checked (disjoint, complete,
every shard at least ``partition.min_records``) before it is written.
Output: artifacts/partition/{shards.npy, summary.json}.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.data import DataError, Records
from privpipe.data.partition import assign_shards
from tasks import paths
from tasks.common import Skipped, load_array, read_json, skip_stage, stage_logger, staged_dir, write_json
from tasks.identity import check_inputs
from tasks.paths import DatasetPaths
from tasks.prepared import read_shape

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.prepared import PreparedSets
    from tasks.tracking import TrackedRun

__all__ = ["Shards", "run_partition", "partition_task", "load_shards", "shard_assignment"]


def shard_assignment(params: Params, records: Records, *, classes: int, source: Path | str) -> np.ndarray:
    """Each record's shard; a refused partition (too few records per shard, …) names the key or ``source``.
    ``classes``: the declared label set's size (public: from the task, not from the labels)."""
    cfg = params.partition
    try:
        return assign_shards(records.ids, records.labels, shards=cfg.shards, strategy=cfg.strategy,
                             seed=params.run.seed, alpha=cfg.alpha, labels_per_shard=cfg.labels_per_shard,
                             min_records=cfg.min_records, classes=classes)
    except ValueError as exc:  # the library names the argument: shards, alpha, labels_per_shard, …
        message = str(exc)
        if message.split(":")[0] in ("ids", "labels"):
            raise DataError(f"{source}: {message}") from None
        raise ConfigError(f"partition.{message}") from None


@dataclass(frozen=True)
class Shards:
    """The partition stage's output: each sensitive record's shard, under ``dir`` (the shard sizes stay there:
    they depend on the sensitive labels)."""

    dir: Path
    shards: int
    strategy: str

    def metrics(self) -> dict[str, int | str]:
        """metrics/partition.json: the settings only."""
        return {"shards": self.shards, "strategy": self.strategy}

    @classmethod
    def read(cls, where: DatasetPaths) -> Shards:
        """The last partition's output, from its metrics file (what ``privpipe stage evaluate --track`` records)."""
        figures = read_json(where.metrics_file("partition"))
        return cls(dir=where.partition, shards=figures["shards"], strategy=figures["strategy"])

    def log(self, run: TrackedRun) -> None:
        run.log_stage_figures("partition", self.metrics())


def run_partition(params: Params, *, where: DatasetPaths | None = None) -> Shards | Skipped:
    where = where or paths.for_params(params)
    made_from = check_inputs(params, where.prepared)
    out, sensitive = where.partition, where.sensitive
    if not params.student.enabled:
        return skip_stage("partition", out, "student.enabled is false", metrics_file=where.metrics_file("partition"),
                          made_from=made_from)
    log = stage_logger("partition")
    cfg = params.partition
    records = Records.load(sensitive)
    shards = shard_assignment(params, records, classes=read_shape(Path(sensitive).parent).n_classes,
                              source=sensitive)
    # shard sizes depend on the sensitive labels (per-class counts under label skew): kept with the
    # partition, not in metrics, MLflow or logs
    sizes = np.bincount(shards, minlength=cfg.shards)
    result = Shards(dir=out, shards=cfg.shards, strategy=cfg.strategy)
    with staged_dir(out, made_from=made_from) as staging:
        np.save(staging / "shards.npy", shards)
        write_json(staging / "summary.json", {**result.metrics(), "records_digest": _digest(records.ids),
                                              "sizes": sizes.tolist()})
    write_json(where.metrics_file("partition"), result.metrics())
    log.info("partition: %d %s shards", cfg.shards, cfg.strategy)
    return result


def _digest(ids: np.ndarray) -> str:
    return hashlib.sha256("\n".join(ids.astype(str)).encode()).hexdigest()


def load_shards(partition_dir: Path, ids: np.ndarray) -> np.ndarray:
    """The shard of every sensitive record (given by its ``ids``); refuses a partition of other records."""
    shards = load_array(Path(partition_dir) / "shards.npy")
    if read_json(Path(partition_dir) / "summary.json")["records_digest"] != _digest(ids):
        raise DataError(f"{partition_dir}: partition of other records than the sensitive set; "
                        "re-run the partition stage")
    return shards


@task(name="partition", cache_policy=NO_CACHE)
def partition_task(params: Params, run: TrackedRun, prepared: PreparedSets) -> Shards:
    result = run_partition(params, where=prepared.where)
    if isinstance(result, Skipped):
        raise RuntimeError("partition_task runs only when student.enabled is true")
    result.log(run)
    return result
