"""Seeded splits that keep every class represented."""

from __future__ import annotations

import numpy as np

from privpipe.data.records import Records

__all__ = ["stratified_split", "subsample"]


def stratified_split(records: Records, *, test_fraction: float, seed: int) -> tuple[Records, Records]:
    """Split into (train, test) with class proportions kept."""
    # imported here: scikit-learn takes seconds, and most commands (every bad-input error) never split
    from sklearn.model_selection import train_test_split

    index = np.arange(len(records))
    train, test = train_test_split(index, test_size=test_fraction, random_state=seed, stratify=records.labels)
    return records.subset(np.sort(train)), records.subset(np.sort(test))


def subsample(records: Records, *, size: int, seed: int) -> Records:
    """A seeded subset of ``size`` records (all of them if size is 0 or too large)."""
    if size <= 0 or size >= len(records):
        return records
    index = np.random.default_rng(seed).choice(len(records), size=size, replace=False)
    return records.subset(np.sort(index))
