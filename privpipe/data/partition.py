"""Split a set of records into disjoint shards (PATE teachers; federated clients).

    assignment = assign_shards(records.ids, records.labels, shards=250, strategy="iid", seed=0)
    teacher_sets = [records.subset(index) for index in shard_indices(assignment, 250)]

Privacy requirement
-------------------
PATE's analysis (Papernot et al. 2017, 2018) bounds the effect of one record on the
vote histograms by assuming that adding or removing ONE record changes the training
set of at most ONE teacher. A seeded permutation of the whole set breaks this: removing
one record shifts every later record by one position, so many teachers' sets change.

Here a record's shard is a function of ``(seed, its own id, its own label)`` and of
public, data-independent quantities only (``shards``, the strategy's parameters and the
number of classes). Its uniform draw ``u ∈ [0, 1)`` is a keyed BLAKE2b hash of
``"{seed}:{id}"``, and ``u`` is mapped to a shard by the strategy:

- ``iid``: ``floor(u · shards)``.
- ``dirichlet`` (label skew, Hsu et al. 2019): per class ``c``, shard proportions
  ``p_c ~ Dirichlet(alpha · 1)`` drawn from ``default_rng([seed, c])`` (so they depend on
  the seed and the class, not on the data); a record of class ``c`` goes to the shard at
  which the cumulative sum of ``p_c`` first exceeds ``u``.
- ``label_shards``: shard ``s`` holds ``labels_per_shard`` classes, taken cyclically from a
  seeded permutation of the classes (so every class is held when
  ``shards · labels_per_shard ≥ classes``); a record of class ``c`` goes to one of the
  shards that hold ``c``, picked by ``u``.

Adding, removing or reordering other records therefore never moves a record. The number
of classes is treated as public: pass ``classes`` where it is known (e.g. 10 for digits);
otherwise it is inferred as ``labels.max() + 1``, which ``label_shards`` depends on, so
the inferred value must be one the data owner would publish anyway. Record ids must be
stable and must not themselves be secret-dependent (they are loaded with the data).

Caveat: :func:`check_partition` refusing a partition (a shard below ``min_records``) is
itself data-dependent; it stops the run before any release, so nothing is published.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numpy.typing import NDArray

from privpipe.config.partition import PARTITION_STRATEGIES

__all__ = ["STRATEGIES", "assign_shards", "check_partition", "shard_indices", "shard_classes", "record_uniforms"]

STRATEGIES = PARTITION_STRATEGIES
_MANTISSA_BITS = 53  # a float64 holds 53 bits exactly: keep the top 53 of the 64-bit hash


def record_uniforms(ids: np.ndarray, *, seed: int) -> np.ndarray:
    """Per-record uniforms in [0, 1) from a keyed hash of ``(seed, id)``.

    Each value depends only on the seed and that record's id, never on the other records.
    """
    values = np.empty(len(ids), dtype=np.float64)
    for i, record_id in enumerate(ids):
        digest = hashlib.blake2b(f"{seed}:{record_id}".encode(), digest_size=8).digest()
        values[i] = (int.from_bytes(digest, "big") >> (64 - _MANTISSA_BITS)) / 2.0**_MANTISSA_BITS
    return values


def shard_classes(*, shards: int, classes: int, labels_per_shard: int, seed: int) -> np.ndarray:
    """The ``(shards, labels_per_shard)`` classes each ``label_shards`` shard holds.

    Shard ``s`` takes positions ``s·L … s·L + L − 1`` (mod ``classes``) of a seeded permutation
    of the classes: consecutive, so a shard's classes are distinct, and cyclic, so every class
    is held once ``shards · L ≥ classes``. Depends only on the seed and public sizes.
    """
    order = np.random.default_rng([seed, classes]).permutation(classes)
    positions = np.arange(shards)[:, None] * labels_per_shard + np.arange(labels_per_shard)[None, :]
    held: NDArray[np.int64] = order[positions % classes].astype(np.int64)
    return held


def _iid(u: np.ndarray, shards: int) -> np.ndarray:
    shard: NDArray[np.int64] = np.minimum(np.floor(u * shards).astype(np.int64), shards - 1)
    return shard


def _dirichlet(u: np.ndarray, labels: np.ndarray, *, shards: int, alpha: float, seed: int) -> np.ndarray:
    assignment = np.empty(len(u), dtype=np.int64)
    for c in np.unique(labels):
        # proportions from (seed, class) alone: the data never changes them
        proportions = np.random.default_rng([seed, int(c)]).dirichlet(np.full(shards, alpha))
        members = labels == c
        # the cumulative sum may end a hair below 1: clip so u near 1 lands in the last shard
        assignment[members] = np.minimum(np.searchsorted(np.cumsum(proportions), u[members], side="right"),
                                         shards - 1)
    return assignment


def _label_shards(u: np.ndarray, labels: np.ndarray, *, shards: int, classes: int, labels_per_shard: int,
                  seed: int) -> np.ndarray:
    held = shard_classes(shards=shards, classes=classes, labels_per_shard=labels_per_shard, seed=seed)
    assignment = np.empty(len(u), dtype=np.int64)
    for c in np.unique(labels):
        holders = np.flatnonzero((held == c).any(axis=1))
        members = labels == c
        pick = np.minimum(np.floor(u[members] * len(holders)).astype(np.int64), len(holders) - 1)
        assignment[members] = holders[pick]
    return assignment


def _check_arguments(ids: np.ndarray, labels: np.ndarray, *, shards: int, strategy: str, seed: int, alpha: float,
                     labels_per_shard: int, min_records: int, classes: int) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: unknown {strategy!r} (choose one of {', '.join(STRATEGIES)})")
    if int(shards) != shards or shards < 1:
        raise ValueError(f"shards: must be an integer >= 1, got {shards!r}")
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed: must be an integer >= 0, got {seed!r}")
    if not alpha > 0:
        raise ValueError(f"alpha: must be > 0, got {alpha!r}")
    if int(min_records) != min_records or min_records < 0:
        raise ValueError(f"min_records: must be an integer >= 0 (0: empty shards allowed), got {min_records!r}")
    if ids.ndim != 1 or labels.shape != ids.shape:
        raise ValueError(f"ids and labels must be 1-D of one length, got shapes {ids.shape} and {labels.shape}")
    if len(labels) and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels: must be integers, got dtype {labels.dtype}")
    if len(labels) and (labels.min() < 0 or labels.max() >= classes):
        raise ValueError(f"labels: must lie in [0, {classes}), got [{labels.min()}, {labels.max()}]")
    if strategy == "label_shards":
        if not 1 <= labels_per_shard <= classes:
            raise ValueError(f"labels_per_shard: must lie in [1, {classes}] (the class count), "
                             f"got {labels_per_shard!r}")
        if shards * labels_per_shard < classes:
            raise ValueError(f"labels_per_shard: {shards} shards × {labels_per_shard} labels cannot hold all "
                             f"{classes} classes; raise labels_per_shard or shards")


def _check_classes_held(labels: np.ndarray, *, shards: int, classes: int, labels_per_shard: int, seed: int,
                        min_records: int) -> None:
    """label_shards: refuse a shard whose classes have no records at all, naming the labels (fewer
    shards, what check_partition would advise, cannot fill it)."""
    if min_records == 0:
        return
    present = np.bincount(labels, minlength=classes) > 0
    held = shard_classes(shards=shards, classes=classes, labels_per_shard=labels_per_shard, seed=seed)
    empty = np.flatnonzero(~present[held].any(axis=1))
    if len(empty):
        s = int(empty[0])
        names = ", ".join(str(int(c)) for c in held[s])
        these = "classes" if labels_per_shard > 1 else "class"
        raise ValueError(f"labels: label_shards shard {s} holds only {these} {names}, with no records; "
                         "every class needs records (or raise labels_per_shard)")


def assign_shards(ids: np.ndarray, labels: np.ndarray, *, shards: int, strategy: str, seed: int,
                  alpha: float = 0.5, labels_per_shard: int = 2, min_records: int = 1,
                  classes: int | None = None) -> np.ndarray:
    """Shard index (int64, in ``[0, shards)``) of every record.

    Parameters
    ----------
    ids, labels
        One id and one integer label per record; ids must be unique and stable.
    shards
        Number of disjoint shards (teachers or clients).
    strategy
        ``iid``, ``dirichlet`` (uses ``alpha``; smaller is more skewed) or ``label_shards``
        (uses ``labels_per_shard``).
    classes
        The public class count; ``None`` infers ``labels.max() + 1``.

    Raises
    ------
    ValueError
        A bad argument (the message names it), or a shard left with fewer than
        ``min_records`` records (the message names ``shards``).
    """
    ids = np.asarray(ids)
    labels = np.asarray(labels)
    if classes is None:
        classes = int(labels.max()) + 1 if len(labels) else 1
    elif int(classes) != classes or classes < 1:
        raise ValueError(f"classes: must be an integer >= 1, got {classes!r}")
    _check_arguments(ids, labels, shards=shards, strategy=strategy, seed=seed, alpha=alpha,
                     labels_per_shard=labels_per_shard, min_records=min_records, classes=classes)
    if len(np.unique(ids)) != len(ids):
        raise ValueError("ids: record ids are not unique")
    u = record_uniforms(ids, seed=seed)
    if strategy == "iid":
        assignment = _iid(u, shards)
    elif strategy == "dirichlet":
        assignment = _dirichlet(u, labels, shards=shards, alpha=alpha, seed=seed)
    else:
        _check_classes_held(labels, shards=shards, classes=classes, labels_per_shard=labels_per_shard, seed=seed,
                            min_records=min_records)
        assignment = _label_shards(u, labels, shards=shards, classes=classes, labels_per_shard=labels_per_shard,
                                   seed=seed)
    check_partition(assignment, shards=shards, n_records=len(ids), min_records=min_records)
    return assignment


def check_partition(assignment: np.ndarray, *, shards: int, n_records: int, min_records: int = 1) -> None:
    """Check that every record is in exactly one shard of ``[0, shards)`` and each shard is big enough.

    An assignment vector puts each record in one shard by construction (disjointness);
    coverage means one in-range entry for every record.

    Raises
    ------
    ValueError
        On a malformed assignment, or with a message naming ``shards`` when some shard holds
        fewer than ``min_records`` records (including ``shards > n_records``).
    """
    assignment = np.asarray(assignment)
    if assignment.shape != (n_records,):
        raise ValueError(f"assignment: expected one shard per record ({n_records}), got shape {assignment.shape}")
    if n_records and not np.issubdtype(assignment.dtype, np.integer):
        raise ValueError(f"assignment: shard indices must be integers, got dtype {assignment.dtype}")
    if n_records and (assignment.min() < 0 or assignment.max() >= shards):
        raise ValueError(f"assignment: shard indices must lie in [0, {shards}), "
                         f"got [{assignment.min()}, {assignment.max()}]")
    counts = np.bincount(assignment, minlength=shards) if n_records else np.zeros(shards, dtype=np.int64)
    short = np.flatnonzero(counts < min_records)
    if len(short):
        s = int(short[0])
        raise ValueError(f"shards: {shards} shards for {n_records} records leaves shard {s} with {counts[s]} records "
                         f"(need ≥ {min_records}); use fewer shards")


def shard_indices(assignment: np.ndarray, shards: int) -> list[np.ndarray]:
    """Record indices of each shard, ascending: ``result[s]`` selects shard ``s``'s records."""
    assignment = np.asarray(assignment)
    if len(assignment) and (assignment.min() < 0 or assignment.max() >= shards):
        raise ValueError(f"assignment: shard indices must lie in [0, {shards})")
    order = np.argsort(assignment, kind="stable")  # stable: indices stay ascending within a shard
    counts = np.bincount(assignment, minlength=shards) if len(assignment) else np.zeros(shards, dtype=np.int64)
    return [part.astype(np.int64) for part in np.split(order, np.cumsum(counts)[:-1])]
