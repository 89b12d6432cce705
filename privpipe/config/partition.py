"""partition: the sensitive set → disjoint shards, one per PATE teacher."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.errors import one_of, require
from privpipe.config.ranges import MAX_COUNT, MAX_SCALE, Range, above, at_least

#: how records are dealt out; the federated section splits into clients the same ways. privpipe.data.partition's
#: STRATEGIES, written out because importing privpipe.data (numpy) would double the time checking params takes;
#: tests/library/config/test_config.py fails if they ever differ
PARTITION_STRATEGIES = ("iid", "dirichlet", "label_shards")


@dataclass(frozen=True)
class PartitionConfig:
    #: teachers; PATE's votes are only informative with many of them
    shards: int = 50  # PATE's votes are only informative with many teachers; digits gives each about 14 records
    #: iid | dirichlet (label skew, alpha) | label_shards (labels_per_shard classes each)
    strategy: str = "iid"
    #: dirichlet: concentration of each shard's label mix (smaller: more skew)
    alpha: float = 0.5
    #: label_shards: how many classes each shard holds
    labels_per_shard: int = 2
    #: refuse a partition leaving any shard smaller than this
    min_records: int = 5

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {
        "shards": at_least(1, MAX_COUNT), "alpha": above(0, MAX_SCALE), "labels_per_shard": at_least(1, 10**6),
        "min_records": at_least(1, MAX_COUNT),
    }


def check(partition: PartitionConfig) -> None:
    require(partition.shards >= 1, "partition.shards", "must be >= 1")
    one_of(partition.strategy, PARTITION_STRATEGIES, "partition.strategy")
    require(partition.alpha > 0, "partition.alpha", "must be > 0")
    require(partition.labels_per_shard >= 1, "partition.labels_per_shard", "must be >= 1")
    require(partition.min_records >= 1, "partition.min_records", "must be >= 1")
