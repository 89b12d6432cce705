"""partition: split the sensitive set into disjoint shards, one per teacher.

    privpipe stage partition        # what dvc repro runs

Each record's shard depends only on the seed, its id and its label (see
:mod:`privpipe.data.partition`), so adding or removing one record changes one shard:
the adjacency PATE's analysis assumes. The assignment is checked (disjoint, complete,
every shard at least ``partition.min_records``) before it is written.
Output: artifacts/partition/{shards.npy, summary.json}.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.data import Records, class_count
from privpipe.data.partition import assign_shards
from tasks import paths
from tasks.common import skip_stage, stage_logger, staged_dir, write_json

__all__ = ["run_partition", "partition_task", "load_shards"]


def run_partition(params: Params, *, sensitive: Path = paths.SENSITIVE, test: Path = paths.TEST,
                  out: Path = paths.PARTITION) -> dict[str, Any]:
    if not params.student.enabled:
        return skip_stage("partition", out, "student.enabled is false")
    log = stage_logger("partition")
    cfg = params.partition
    records = Records.load(sensitive)
    # the class count is public (it is the task); inferring it from the sensitive labels would let
    # one record (the last of a class) change every shard's classes
    classes = class_count(records, Records.load(test))
    try:
        shards = assign_shards(records.ids, records.labels, shards=cfg.shards, strategy=cfg.strategy,
                               seed=params.run.seed, alpha=cfg.alpha, labels_per_shard=cfg.labels_per_shard,
                               min_records=cfg.min_records, classes=classes)
    except ValueError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith("partition.") else f"partition.{message}") from None
    sizes = np.bincount(shards, minlength=cfg.shards)
    summary = {"shards": cfg.shards, "strategy": cfg.strategy, "records": len(records),
               "smallest": int(sizes.min()), "largest": int(sizes.max()), "sizes": sizes.tolist()}
    with staged_dir(out) as staging:
        np.save(staging / "shards.npy", shards)
        write_json(staging / "summary.json", summary)
    write_json(paths.metrics_file("partition"), {k: v for k, v in summary.items() if k != "sizes"})
    log.info("partition: %d records into %d %s shards (%d–%d each)", len(records), cfg.shards, cfg.strategy,
             sizes.min(), sizes.max())
    return {"dir": str(out), **{k: v for k, v in summary.items() if k != "sizes"}}


def load_shards(partition_dir: Path, records: Records) -> np.ndarray:
    """The shard of every sensitive record; refuses a partition of some other data."""
    shards = np.load(Path(partition_dir) / "shards.npy")
    if shards.shape != (len(records),):
        raise ValueError(f"{partition_dir}: partition has {len(shards)} records, the sensitive set "
                         f"{len(records)}; re-run the partition stage")
    return shards


@task(name="partition", cache_policy=NO_CACHE)
def partition_task(params: Params, run_id: str, sensitive: str, test: str) -> dict[str, Any]:
    from tasks import tracking

    out = run_partition(params, sensitive=Path(sensitive), test=Path(test))
    tracking.log_stage_figures(params, run_id, "partition", out)
    return out
