"""Shard assignment: disjoint, covering, deterministic, and stable under adding or removing a record."""

from __future__ import annotations

import numpy as np
import pytest

from privpipe.data.partition import STRATEGIES, assign_shards, check_partition, shard_classes, shard_indices

CLASSES = 10


def make_set(n: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([f"rec-{i:05d}" for i in range(n)])
    labels = np.random.default_rng(seed).integers(0, CLASSES, size=n)
    return ids, labels


def assign(ids, labels, strategy, **kwargs):
    options = {"shards": 10, "seed": 3, "alpha": 1.0, "labels_per_shard": 2} | kwargs
    return assign_shards(ids, labels, strategy=strategy, **options)


def max_class_share(assignment, labels, shards):
    """Mean over shards of the largest class's share of the shard."""
    shares = [np.bincount(labels[index], minlength=CLASSES).max() / len(index)
              for index in shard_indices(assignment, shards)]
    return float(np.mean(shares))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_record_in_exactly_one_shard(strategy):
    ids, labels = make_set()
    assignment = assign(ids, labels, strategy)
    assert assignment.dtype == np.int64 and assignment.shape == (len(ids),)
    assert assignment.min() >= 0 and assignment.max() < 10
    parts = shard_indices(assignment, 10)
    assert len(parts) == 10 and sum(len(p) for p in parts) == len(ids)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(ids)))
    for s, index in enumerate(parts):
        assert len(index) >= 1 and (assignment[index] == s).all()
        assert np.all(np.diff(index) > 0)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_deterministic_for_a_seed(strategy):
    ids, labels = make_set()
    first = assign(ids, labels, strategy)
    assert np.array_equal(first, assign(ids, labels, strategy))
    assert not np.array_equal(first, assign(ids, labels, strategy, seed=4))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_removing_or_adding_a_record_moves_no_other_record(strategy):
    # PATE's neighbouring-dataset argument: one record changes at most one teacher's shard
    ids, labels = make_set()
    full = assign(ids, labels, strategy)
    for removed in (0, 17, 1000, len(ids) - 1):
        keep = np.arange(len(ids)) != removed
        assert np.array_equal(assign(ids[keep], labels[keep], strategy), full[keep])
    grown = assign(np.append(ids, "rec-new"), np.append(labels, 4), strategy)
    assert np.array_equal(grown[:-1], full)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_shard_depends_on_the_record_not_its_position(strategy):
    ids, labels = make_set()
    order = np.random.default_rng(9).permutation(len(ids))
    assert np.array_equal(assign(ids[order], labels[order], strategy), assign(ids, labels, strategy)[order])


def test_dirichlet_with_small_alpha_is_label_skewed():
    ids, labels = make_set(5000)
    iid = max_class_share(assign(ids, labels, "iid"), labels, 10)
    skewed = max_class_share(assign(ids, labels, "dirichlet", alpha=0.1), labels, 10)
    assert iid < 0.2  # about 1/10 per class
    assert skewed > iid + 0.2


def test_label_shards_hold_only_their_classes():
    ids, labels = make_set()
    assignment = assign(ids, labels, "label_shards", shards=7, labels_per_shard=3)
    held = shard_classes(shards=7, classes=CLASSES, labels_per_shard=3, seed=3)
    assert held.shape == (7, 3)
    assert all(len(set(row)) == 3 for row in held.tolist())
    assert set(held.ravel().tolist()) == set(range(CLASSES))
    for s, index in enumerate(shard_indices(assignment, 7)):
        assert set(labels[index].tolist()) <= set(held[s].tolist())


def test_label_shards_need_room_for_every_class():
    ids, labels = make_set()
    with pytest.raises(ValueError, match="^labels_per_shard:"):
        assign(ids, labels, "label_shards", shards=4, labels_per_shard=2)


def test_public_class_count_keeps_label_shards_stable():
    # without `classes`, dropping the only record of the top class would change the inferred count
    ids, labels = make_set(500)
    labels = np.minimum(labels, 8)
    labels[0] = 9
    full = assign(ids, labels, "label_shards", classes=CLASSES)
    assert np.array_equal(assign(ids[1:], labels[1:], "label_shards", classes=CLASSES), full[1:])


def test_too_many_shards_names_shards():
    ids, labels = make_set(250)
    with pytest.raises(ValueError, match=r"^shards: 300 shards for 250 records leaves shard \d+ with 0 records"):
        assign(ids, labels, "iid", shards=300)
    with pytest.raises(ValueError, match=r"^shards: 20 shards for 250 records .*need ≥ 50"):
        assign(ids, labels, "iid", shards=20, min_records=50)


@pytest.mark.parametrize("kwargs, name", [
    ({"shards": 0}, "shards"),
    ({"alpha": 0.0}, "alpha"),
    ({"alpha": -1.0}, "alpha"),
    ({"seed": -1}, "seed"),
    ({"min_records": -1}, "min_records"),
    ({"strategy": "random"}, "strategy"),
    ({"strategy": "label_shards", "labels_per_shard": 0}, "labels_per_shard"),
    ({"strategy": "label_shards", "labels_per_shard": 11}, "labels_per_shard"),
    ({"classes": 5}, "labels"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
    ids, labels = make_set(100)
    strategy = kwargs.pop("strategy", "iid")
    with pytest.raises(ValueError, match=f"^{name}:"):
        assign(ids, labels, strategy, **kwargs)


def test_mismatched_or_duplicate_ids_are_refused():
    ids, labels = make_set(100)
    with pytest.raises(ValueError, match="one length"):
        assign(ids, labels[:-1], "iid")
    with pytest.raises(ValueError, match="^ids:"):
        assign(np.append(ids[:-1], ids[0]), labels, "iid")


def test_check_partition_refuses_malformed_assignments():
    check_partition(np.array([0, 1, 1, 0]), shards=2, n_records=4)
    with pytest.raises(ValueError, match="one shard per record"):
        check_partition(np.array([0, 1, 1]), shards=2, n_records=4)
    with pytest.raises(ValueError, match=r"lie in \[0, 2\)"):
        check_partition(np.array([0, 1, 2, 0]), shards=2, n_records=4)
    with pytest.raises(ValueError, match="^shards: 3 shards for 4 records leaves shard 2 with 0"):
        check_partition(np.array([0, 1, 1, 0]), shards=3, n_records=4)


def test_dirichlet_shares_follow_the_dirichlet_law():
    """Across seeds, a class's share per client has the Dirichlet(α·1) marginal: mean 1/K and
    variance (1/K)(1 − 1/K)/(Kα + 1) (Hsu et al. 2019's label skew)."""
    shards, alpha, n = 10, 2.0, 2000
    ids = np.array([f"rec-{i:05d}" for i in range(n)])
    labels = np.zeros(n, dtype=np.int64)  # one class: its split over clients is one Dirichlet draw
    shares = np.array([np.bincount(assign_shards(ids, labels, shards=shards, strategy="dirichlet", seed=seed,
                                                 alpha=alpha, classes=CLASSES), minlength=shards) / n
                       for seed in range(100)])
    p = 1 / shards
    assert shares.mean() == pytest.approx(p, abs=1e-12)  # every record lands somewhere
    assert shares.var() == pytest.approx(p * (1 - p) / (shards * alpha + 1), rel=0.3)
    # and a larger α is closer to IID
    flat = np.array([np.bincount(assign_shards(ids, labels, shards=shards, strategy="dirichlet", seed=seed,
                                               alpha=100.0, classes=CLASSES), minlength=shards) / n
                     for seed in range(20)])
    assert flat.var() < shares.var() / 20


def test_min_records_zero_allows_empty_shards():
    ids, labels = make_set(30)
    assignment = assign(ids, labels, "iid", shards=100, min_records=0)
    assert len(np.unique(assignment)) < 100  # some clients hold nothing, and that is allowed
