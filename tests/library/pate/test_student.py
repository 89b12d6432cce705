"""The student: class-balanced sampling, determinism, learning, domain adaptation by association,
and argument checks."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch

from privpipe.models import make_network
from privpipe.pate.student import StudentConfig, _BalancedSampler, train_student

torch.set_num_threads(1)
CENTRES = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]])  # not symmetric, so no class permutation fits as well
TARGET_SHIFT = (1.5, 1.5)  # moves target clusters across a source-only classifier's boundaries
QUICK = dict(steps=300, labeled_batch=30, unlabeled_batch=60, learning_rate=0.01, weight_decay=0.0,
             walker_weight=1.0, visit_weight=0.5, cover_weight=0.1, delay_steps=50, ramp_steps=50)


def blobs(n: int, seed: int, shift: tuple[float, float] = (0.0, 0.0)) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, size=n)
    return (CENTRES[labels] + shift + rng.normal(scale=0.5, size=(n, 2))).astype(np.float32), labels


def fresh_network(init_seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(init_seed)
    return make_network("mlp", in_features=2, hidden_units=[32, 16], classes=3)


def accuracy(network: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((network(torch.as_tensor(x)).argmax(dim=1).numpy() == y).mean())


def test_balanced_sampler_draws_each_class_equally():
    labels = np.array([0] * 90 + [1] * 3 + [2] * 7)
    sampler = _BalancedSampler(labels, torch.Generator().manual_seed(0))
    batch = sampler.draw(30)
    assert Counter(labels[batch.numpy()].tolist()) == {0: 10, 1: 10, 2: 10}
    assert len(set(batch[labels[batch.numpy()] == 0].tolist())) == 10  # large class: without replacement
    assert sorted(Counter(labels[sampler.draw(31).numpy()].tolist()).values()) == [10, 10, 11]


def test_student_learns_and_logs():
    x, y = blobs(150, seed=0)
    target_x, _ = blobs(300, seed=1, shift=TARGET_SHIFT)
    logged: list[dict] = []
    result = train_student(fresh_network(), labeled_x=x, labeled_y=y, unlabeled_x=target_x,
                           config=StudentConfig(**QUICK), seed=0, log_every=100, on_log=logged.append)
    assert not result.network.training
    assert accuracy(result.network, x, y) > 0.95
    assert [entry["step"] for entry in result.history] == [0, 100, 200, 299]
    assert logged == result.history
    first, last = result.history[0], result.history[-1]
    assert set(result.history[0]) == {"step", "loss", "classification", "walker", "visit", "cover", "consistency",
                                      "masked", "weight", "floor"}
    # the weighted association terms' minima: the loss sits above them, and close once trained
    assert first["floor"] == 0.0 and all(entry["loss"] >= entry["floor"] for entry in result.history)
    assert last["loss"] - last["floor"] < 1.0
    assert [entry["weight"] for entry in result.history] == [0.0, 1.0, 1.0, 1.0]
    assert first["loss"] == first["classification"]  # association still delayed
    assert last["classification"] < 0.1 * first["classification"]
    assert last["walker"] < first["walker"] and last["visit"] < first["visit"]


def test_training_is_deterministic_for_a_seed():
    x, y = blobs(60, seed=2)
    target_x, _ = blobs(60, seed=3, shift=TARGET_SHIFT)
    config = StudentConfig(**QUICK | {"steps": 30, "delay_steps": 5, "ramp_steps": 5})
    states = [train_student(fresh_network(), labeled_x=x, labeled_y=y, unlabeled_x=target_x, config=config,
                            seed=seed).network.state_dict() for seed in (4, 4, 5)]
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert not all(torch.equal(states[0][k], states[2][k]) for k in states[0])


def test_association_adapts_to_a_shifted_target_domain():
    x, y = blobs(150, seed=0)
    target_x, target_y = blobs(300, seed=1, shift=TARGET_SHIFT)
    source_only = StudentConfig(**QUICK | {"walker_weight": 0.0, "visit_weight": 0.0, "cover_weight": 0.0})
    accuracies = {}
    for name, config in (("source_only", source_only), ("association", StudentConfig(**QUICK))):
        network = train_student(fresh_network(), labeled_x=x, labeled_y=y, unlabeled_x=target_x,
                                config=config, seed=0).network
        accuracies[name] = accuracy(network, target_x, target_y)
    assert accuracies["source_only"] < 0.8
    assert accuracies["association"] > accuracies["source_only"] + 0.1


def test_empty_unlabeled_pool_trains_on_labels_alone():
    x, y = blobs(90, seed=6)
    result = train_student(fresh_network(), labeled_x=x, labeled_y=y, unlabeled_x=np.empty((0, 2), np.float32),
                           config=StudentConfig(**QUICK | {"steps": 100}), seed=0, log_every=50)
    assert accuracy(result.network, x, y) > 0.95
    for entry in result.history:
        assert entry["walker"] == entry["visit"] == entry["cover"] == 0.0
        assert entry["loss"] == entry["classification"]


def test_rows_may_be_images_and_an_empty_pool_any_shape():
    rng = np.random.default_rng(8)
    images = rng.normal(size=(12, 1, 4, 4)).astype(np.float32)
    labels = np.arange(12) % 2
    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    config = StudentConfig(**QUICK | {"steps": 3, "labeled_batch": 4, "delay_steps": 0, "ramp_steps": 0})
    last = [train_student(network, labeled_x=images, labeled_y=labels, unlabeled_x=pool, config=config,
                          seed=0).history[-1] for pool in (images[6:], np.empty(0, np.float32))]
    assert all(np.isfinite(entry["loss"]) for entry in last)
    assert last[0]["walker"] > 0 and last[1]["walker"] == 0.0


def test_bad_training_inputs_are_refused():
    x, y = blobs(20, seed=7)
    config = StudentConfig(**QUICK | {"steps": 1})
    kwargs = dict(labeled_x=x, labeled_y=y, unlabeled_x=x, config=config, seed=0)
    cases = [
        ("labeled_x", {"labeled_x": x[:0], "labeled_y": y[:0]}),
        ("labeled_y", {"labeled_y": y[:-1]}),
        ("labeled_y", {"labeled_y": y.astype(np.float32)}),
        ("labeled_y: label 3", {"labeled_y": np.where(y == 0, 3, y)}),
        ("labeled_y: label -1", {"labeled_y": np.where(y == 0, -1, y)}),
        ("unlabeled_x", {"unlabeled_x": np.zeros((5, 4), np.float32)}),
        ("log_every", {"log_every": 0}),
    ]
    for message, change in cases:
        with pytest.raises(ValueError, match=f"^{message}"):
            train_student(fresh_network(), **kwargs | change)
    with pytest.raises(ValueError, match="^network:"):
        train_student(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU()), **kwargs)


@pytest.mark.parametrize("field, value", [
    ("steps", 0), ("labeled_batch", 0), ("unlabeled_batch", 2.5), ("learning_rate", 0.0),
    ("weight_decay", -1e-4), ("walker_weight", -1.0), ("visit_weight", float("nan")), ("cover_weight", -0.1),
    ("delay_steps", -1), ("ramp_steps", True), ("cover_target", "targets"), ("consistency_weight", -1.0),
    ("confidence_threshold", 0.0), ("confidence_threshold", 1.5), ("lr_schedule", "linear"),
])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        StudentConfig(**QUICK | {field: value})


def test_cover_target_picks_the_cover_loss_and_its_floor():
    x, y = blobs(60, seed=2)
    target_x, _ = blobs(60, seed=3, shift=TARGET_SHIFT)
    last = {}
    for target in ("samples", "classes"):
        config = StudentConfig(**QUICK | {"steps": 2, "delay_steps": 0, "ramp_steps": 0, "cover_target": target})
        last[target] = train_student(fresh_network(), labeled_x=x, labeled_y=y, unlabeled_x=target_x,
                                     config=config, seed=0).history[-1]
    # samples: uniform over the 30 batch rows; classes: over the 3 classes in the batch
    assert last["samples"]["cover"] >= np.log(30) - 1e-4 and last["classes"]["cover"] < np.log(30) - 1
    floor_difference = QUICK["cover_weight"] * (np.log(30) - np.log(3))
    assert last["samples"]["floor"] - last["classes"]["floor"] == pytest.approx(floor_difference)


def halves(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """28×28 images with a bright bar in the left (class 0) or right (class 1) half: a shift keeps the class."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=n)
    images = rng.random((n, 28, 28)).astype(np.float32) * 0.1
    for image, label in zip(images, labels):
        image[6:22, 4 + 16 * label:8 + 16 * label] += 1.0
    return images.reshape(n, 784), labels


def test_consistency_pseudo_labels_confident_unlabeled_images():
    x, y = halves(6, seed=0)
    pool, pool_y = halves(64, seed=1)
    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Linear(784, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    config = StudentConfig(**QUICK | {"steps": 40, "labeled_batch": 6, "unlabeled_batch": 32, "delay_steps": 0,
                                      "ramp_steps": 0, "consistency_weight": 1.0, "confidence_threshold": 0.8})
    result = train_student(network, labeled_x=x, labeled_y=y, unlabeled_x=pool, config=config, seed=0, log_every=39)
    first, last = result.history
    assert first["masked"] < last["masked"] and last["masked"] > 0.5 and last["consistency"] >= 0
    assert accuracy(result.network, pool, pool_y) > 0.95
    # on flat non-image rows there is nothing to augment: refused before training
    with pytest.raises(ValueError, match="^consistency_weight:"):
        blob_x, blob_y = blobs(20, seed=7)
        train_student(fresh_network(), labeled_x=blob_x, labeled_y=blob_y, unlabeled_x=blob_x, config=config, seed=0)


def test_cosine_schedule_follows_fixmatchs_decay():
    x, y = blobs(30, seed=2)
    network = fresh_network()
    config = StudentConfig(**QUICK | {"steps": 16, "lr_schedule": "cosine"})
    seen = []
    original = torch.optim.Adam.step

    def record(self, *args, **kwargs):
        seen.append(self.param_groups[0]["lr"])
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.optim.Adam, "step", record)
        train_student(network, labeled_x=x, labeled_y=y, unlabeled_x=x[:0], config=config, seed=0)
    assert seen[0] == pytest.approx(QUICK["learning_rate"])
    assert seen[-1] == pytest.approx(QUICK["learning_rate"] * np.cos(7 * np.pi * 15 / 256))
    assert all(a > b for a, b in itertools.pairwise(seen))

