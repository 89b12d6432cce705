"""Record-keyed splits: a record's set is a function of the seed and its own id alone.

    sets = split_by_shares(records, {"test": 0.2, "public": 0.1}, rest="sensitive", seed=0)
    quick = subsample(sets["sensitive"], size=500, seed=0)

Why not a seeded shuffle of row positions (``train_test_split``)? Erasing one record shifts
every later position, so a re-run after a deletion reshuffles the whole split: test records
become training records and DP-protected records land in sets used without DP. Here each
record draws ``u ∈ [0, 1)`` from a keyed BLAKE2b hash of ``"split:{seed}:{id}"`` and takes
the set whose interval of the cumulative shares holds ``u``. Adding, erasing or reordering
other records never moves it.

The shares are proportions in expectation, per class as well (every class meets the same
thresholds), not exact counts: exact per-class counts need ranks within a class, and ranks
move when a record is erased. With 1,797 digits a 20 % share has a standard deviation of about 17 records.

The ``split:`` domain keeps the draw independent of the partition's shard hash
(``"{seed}:{id}"``, :mod:`privpipe.data.partition`): with one shared draw every training
record would have ``u`` above the test share and the low shards would be empty.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from privpipe.data.records import Records

__all__ = ["keyed_uniforms", "assign_sets", "split_by_shares", "subsample", "subsample_positions", "SPLIT_DOMAIN",
           "SUBSAMPLE_DOMAIN"]

SPLIT_DOMAIN = "split"
SUBSAMPLE_DOMAIN = "subsample"
_MANTISSA_BITS = 53  # a float64 holds 53 bits exactly: keep the top 53 of the 64-bit hash


def keyed_uniforms(ids: np.ndarray, *, seed: int, domain: str) -> np.ndarray:
    """Per-record uniforms in [0, 1) from BLAKE2b of ``"{domain}:{seed}:{id}"``; each depends on
    that record's id alone. Different domains give independent draws for the same records."""
    values = np.empty(len(ids), dtype=np.float64)
    for i, record_id in enumerate(ids):
        digest = hashlib.blake2b(f"{domain}:{seed}:{record_id}".encode(), digest_size=8).digest()
        values[i] = (int.from_bytes(digest, "big") >> (64 - _MANTISSA_BITS)) / 2.0**_MANTISSA_BITS
    return values


def assign_sets(ids: np.ndarray, shares: Mapping[str, float], *, rest: str, seed: int) -> np.ndarray:
    """The set name of each record: ``shares`` are fractions of the whole, in order, and what
    they leave goes to ``rest``."""
    fractions = np.array(list(shares.values()), dtype=np.float64)
    if (fractions < 0).any() or fractions.sum() > 1.0 + 1e-12:
        raise ValueError(f"shares: must be non-negative and sum to at most 1, got {dict(shares)}")
    names = np.array([*shares, rest])
    u = keyed_uniforms(np.asarray(ids), seed=seed, domain=SPLIT_DOMAIN)
    # side="right": u exactly on a boundary belongs to the later set, as u = 0 belongs to the first
    return names[np.searchsorted(np.cumsum(fractions), u, side="right")]


def split_by_shares(records: Records, shares: Mapping[str, float], *, rest: str, seed: int) -> dict[str, Records]:
    """``records`` split into the named shares and ``rest`` (see :func:`assign_sets`); ids ascend
    in file order within each set."""
    names = assign_sets(records.ids, shares, rest=rest, seed=seed)
    return {name: records.subset(np.flatnonzero(names == name)) for name in (*shares, rest)}


def subsample(records: Records, *, size: int, seed: int) -> Records:
    """The ``size`` records with the smallest keyed draw (all of them if size is 0 or too large).

    A bottom-``size`` sample by ``"subsample:{seed}:{id}"``: erasing an unused record changes
    nothing, and erasing a used one brings in exactly one unused record (the next draw up) to
    keep the size; a used record never becomes unused because another was erased.
    """
    if size <= 0 or size >= len(records):
        return records
    chosen = subsample_positions([records.ids], size=size, seed=seed, ids_at=lambda rows: records.ids[rows])
    return records if chosen is None else records.subset(chosen)


def subsample_positions(ids: Iterable[np.ndarray], *, size: int, seed: int,
                        ids_at: Callable[[np.ndarray], np.ndarray]) -> np.ndarray | None:
    """:func:`subsample`'s records as ascending positions, the ids read a chunk at a time (memory: a draw a
    record); None where it keeps them all. ``ids_at`` gives the ids at some positions: a tie of draws at the
    cut (2⁻⁵³-likely) is broken by the id, the same way every time."""
    u = np.concatenate([keyed_uniforms(chunk, seed=seed, domain=SUBSAMPLE_DOMAIN) for chunk in ids] or
                       [np.empty(0)])
    if size <= 0 or size >= len(u):
        return None
    cut = np.partition(u, size - 1)[size - 1]
    below, ties = np.flatnonzero(u < cut), np.flatnonzero(u == cut)
    need = size - len(below)
    if need < len(ties):
        ties = ties[np.argsort(np.asarray(ids_at(ties)).astype(str), kind="stable")[:need]]
    return np.sort(np.concatenate([below, ties]))
