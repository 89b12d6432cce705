"""Secure mode (``privacy.secure_rng: true``): every noise value and sampling coin of every mechanism
comes from the OS CSPRNG, never from a seeded generator; without it, the same seed repeats a run.

For each mechanism: (a) seeded, the same seed gives the same output; (b) secure, the same seed
gives different outputs; (c) secure, under a tripwire that fails on any draw from a seeded numpy
or torch generator (numpy's ``Generator`` methods cannot be patched, so ``default_rng`` hands out
a generator that fails on first use), the mechanism runs and takes at least 8 bytes from
``os.urandom`` per value it draws; and, as a control, the same tripwire does catch the seeded run.
The statistics of the secure samplers are at the end.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import opacus.optimizers.optimizer
import pytest
import torch
from scipy import stats
from torch import nn

from privpipe.dp_pca import dp_pca
from privpipe.dpsgd import DpSgdSettings, make_private_training, train_dpsgd
from privpipe.federated import FedAvgConfig, run_fedavg
from privpipe.federated.sampling import ClientSampler
from privpipe.pate.aggregate import UNANSWERED, confident_gnmax, gnmax, lnmax
from privpipe.pate.aggregators import make_aggregator
from privpipe.pate.analysis import sanitise
from privpipe.privacy import Ledger, NoiseSource, secure_laplace, secure_noise, secure_normal, secure_uniform
from privpipe.removal import RemovableHead, RemovalGuarantee

SEED = 7
TEACHERS, CLASSES, QUERIES = 250, 10, 100


# -- tripwire and spies -----------------------------------------------------------------------------


class SeededDraw(AssertionError):
    """A draw from a seeded (non-OS) generator where secure mode forbids one."""


def _forbidden(name: str) -> Callable[..., Any]:
    def draw(*_args: Any, **_kwargs: Any) -> Any:
        raise SeededDraw(f"{name}: drawn from a seeded generator")
    return draw


class _TripwireGenerator:
    """What ``np.random.default_rng`` hands out under the tripwire: any draw from it fails."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return _forbidden(f"numpy Generator.{name}")


@contextmanager
def seeded_draws_forbidden() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(np.random, "default_rng", lambda *_a, **_k: _TripwireGenerator())
        for name in ("normal", "laplace", "random", "rand", "randn", "uniform", "standard_normal", "choice",
                     "permutation"):
            patch.setattr(np.random, name, _forbidden(f"numpy.random.{name}"))
        for name in ("normal", "randn", "rand", "randint", "randperm", "bernoulli", "poisson"):
            patch.setattr(torch, name, _forbidden(f"torch.{name}"))
        patch.setattr(opacus.optimizers.optimizer, "_generate_noise", _forbidden("Opacus' _generate_noise"))
        yield


@dataclass
class Entropy:
    os_bytes: int = 0  # taken from os.urandom: each secure block's fresh ChaCha20 key and nonce
    stream_bytes: int = 0  # taken from secure_noise._random_bytes: keystream under those keys
    blocks: int = 0  # _random_bytes calls
    uniforms: list[int] = field(default_factory=list)  # the size of every secure_noise._secure_uniform call


@contextmanager
def counting_entropy() -> Iterator[Entropy]:
    seen = Entropy(uniforms=[])
    urandom, stream, uniform = os.urandom, secure_noise._random_bytes, secure_noise._secure_uniform

    def counting_urandom(size: int) -> bytes:
        seen.os_bytes += size
        return urandom(size)

    def counting_stream(count: int) -> bytes | bytearray:
        seen.stream_bytes += count
        seen.blocks += 1
        return stream(count)

    def counting_uniform(count: int) -> np.ndarray:
        seen.uniforms.append(int(count))
        return uniform(count)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "urandom", counting_urandom)
        patch.setattr(secure_noise, "_random_bytes", counting_stream)
        patch.setattr(secure_noise, "_secure_uniform", counting_uniform)
        yield seen


# -- the mechanisms ---------------------------------------------------------------------------------
# Each: setup() builds its inputs (outside the tripwire), run(inputs, secure, seed) returns its output
# as an array; ``values``: how many noise values and coins one run draws at least.


@dataclass
class Mechanism:
    run: Callable[[Any, bool, int], np.ndarray]
    values: int
    setup: Callable[[], Any] = lambda: None


def _tied_histograms() -> np.ndarray:
    """Two classes tied on every query: the noise alone picks the label, so outputs show the draws."""
    return np.tile(np.r_[125, 125, np.zeros(CLASSES - 2, dtype=int)], (QUERIES, 1))


def _lnmax(_inputs, secure: bool, seed: int) -> np.ndarray:
    return lnmax(_tied_histograms(), gamma=0.5, noise=NoiseSource(seed=seed, secure=secure))


def _gnmax(_inputs, secure: bool, seed: int) -> np.ndarray:
    return gnmax(_tied_histograms(), sigma=5.0, noise=NoiseSource(seed=seed, secure=secure))


def _confident_gnmax(_inputs, secure: bool, seed: int) -> np.ndarray:
    # the top count sits on the threshold: about half the queries are answered, each a coin flip
    labels = confident_gnmax(_tied_histograms(), threshold=125.0, sigma1=5.0, sigma2=5.0,
                             noise=NoiseSource(seed=seed, secure=secure))
    assert 0 < (labels == UNANSWERED).sum() < QUERIES
    return labels


CONFIDENT = make_aggregator("confident_gnmax", TEACHERS, CLASSES, threshold=150.0, sigma1=30.0, sigma2=20.0)


def _votes() -> np.ndarray:
    rng = np.random.default_rng(2018)
    tops = rng.integers(200, 240, size=50)
    rest = [rng.multinomial(TEACHERS - t, np.full(CLASSES - 1, 1 / (CLASSES - 1))) for t in tops]
    return np.column_stack([tops, rest])


def _smooth_sensitivity_release(histograms, secure: bool, seed: int) -> np.ndarray:
    release = sanitise(CONFIDENT, histograms, order=20.0, beta=0.01, noise_scale=0.5,
                       failure_probability=1e-2, noise=NoiseSource(seed=seed, secure=secure))
    assert 0.0 < release.released < release.data_independent  # not clipped (clipping would hide the noise)
    return np.array([release.released])


def _dpsgd_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 5)).astype(np.float32), rng.integers(0, 3, size=64)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 3))


def _dpsgd(data, secure: bool, seed: int) -> np.ndarray:
    """Two DP-SGD steps (64 records, lots of 32 expected) with book-keeping clipping, as the pipeline runs it."""
    x, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the insecure-mode warning
        result = train_dpsgd(_model(), x, y, DpSgdSettings(noise_multiplier=1.0, max_grad_norm=1.0, lot_size=32,
                                                           epochs=1, learning_rate=0.5, secure_rng=secure, seed=seed))
    return torch.cat([p.detach().flatten() for p in result.model.parameters()]).numpy()


def _dpsgd_lots(data, secure: bool, seed: int) -> np.ndarray:
    """Which records DP-SGD's Poisson sampler puts into each lot of one epoch (membership masks)."""
    x, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = make_private_training(_model(), x, y, noise_multiplier=1.0, max_grad_norm=1.0, lot_size=32, epochs=1,
                                    learning_rate=0.5, secure_rng=secure, seed=seed)
    sampler = run.loader.batch_sampler
    assert sampler is not None
    lots = list(sampler)
    assert len(lots) == 2
    return np.array([np.isin(np.arange(len(x)), lot) for lot in lots])


def _fedavg(_inputs, secure: bool, seed: int) -> np.ndarray:
    """Two DP-FedAvg rounds: the global model it releases after them."""
    config = FedAvgConfig(clients=32, rounds=2, sample_rate=0.5, clip_norm=1.0, noise_multiplier=1.0)

    def updates(_round: int, _weights: np.ndarray, sampled: np.ndarray) -> list[np.ndarray]:
        return [np.full(4, 0.01 * (k + 1)) for k in sampled]

    result = run_fedavg(np.zeros(4), config=config, client_updates=updates, noise=NoiseSource(seed=seed, secure=secure),
                        ledger=Ledger(epsilon_budget=1e6, delta=1e-5, accountant="rdp"))
    assert result.rounds_run == 2
    return result.weights


def _client_sampling(sampling: str) -> Callable[[Any, bool, int], np.ndarray]:
    def run(_inputs, secure: bool, seed: int) -> np.ndarray:
        sampler = ClientSampler(clients=64, sample_rate=0.5, sampling=sampling,
                                noise=NoiseSource(seed=seed, secure=secure))
        return np.array([np.isin(np.arange(64), sampler.sample()) for _ in range(3)])
    return run


def _head_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 5))
    return X / (1.01 * np.linalg.norm(X, axis=1, keepdims=True)), rng.integers(0, 3, size=60)


GUARANTEE = RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=1.0)


def _head_training(data, secure: bool, seed: int) -> np.ndarray:
    X, y = data
    head = RemovableHead.train(X, y, classes=3, lam=1e-2, guarantee=GUARANTEE,
                               noise=NoiseSource(seed=seed, secure=secure))
    return head.W.ravel()


def _trained_head_without_budget() -> RemovableHead:
    """A head whose removal budget is (practically) nil: every removal is a retrain with a fresh b."""
    X, y = _head_data()
    return RemovableHead.train(X, y, classes=3, lam=1e-2,
                               guarantee=RemovalGuarantee(epsilon=1e-12, delta=1e-4, sigma=1.0),
                               noise=NoiseSource(seed=0, secure=False))


def _head_retrain(head: RemovableHead, secure: bool, seed: int) -> np.ndarray:
    head = copy.deepcopy(head)
    step = head.remove([0, 1], noise=NoiseSource(seed=seed, secure=secure))
    assert step is not None and step.mechanism == "retrain"
    return head.W.ravel()


def _pca_features() -> np.ndarray:
    return np.random.default_rng(4).normal(size=(40, 6))


def _dp_pca(features, secure: bool, seed: int) -> np.ndarray:
    # as tasks/dp_pca.py calls it: a seeded generator is passed either way; secure mode must not use it
    return dp_pca(features, components=2, noise_multiplier=1.0, rng=np.random.default_rng(seed), secure=secure)


CELLS = QUERIES * CLASSES
MECHANISMS = {
    "pate-lnmax": Mechanism(_lnmax, values=CELLS),
    "pate-gnmax": Mechanism(_gnmax, values=CELLS),
    "pate-confident-gnmax": Mechanism(_confident_gnmax, values=QUERIES),
    "pate-smooth-sensitivity-release": Mechanism(_smooth_sensitivity_release, values=1, setup=_votes),
    "dpsgd-noise": Mechanism(_dpsgd, values=2 * (15 + 3) + 2 * 64, setup=_dpsgd_data),
    "dpsgd-lot-sampling": Mechanism(_dpsgd_lots, values=2 * 64, setup=_dpsgd_data),
    "fedavg-noise": Mechanism(_fedavg, values=2 * (4 + 32)),
    "fedavg-poisson-client-sampling": Mechanism(_client_sampling("poisson"), values=3 * 64),
    "fedavg-fixed-client-sampling": Mechanism(_client_sampling("fixed"), values=3 * 64),
    "removal-head-training": Mechanism(_head_training, values=3 * 5, setup=_head_data),
    "removal-head-retrain": Mechanism(_head_retrain, values=2 * 3 * 5, setup=_trained_head_without_budget),
    "dp-pca": Mechanism(_dp_pca, values=6 * 6, setup=_pca_features),
}


@pytest.fixture(scope="module")
def inputs() -> dict[str, Any]:
    return {name: mechanism.setup() for name, mechanism in MECHANISMS.items()}


@pytest.mark.parametrize("name", MECHANISMS)
def test_seeded_runs_repeat(name, inputs):
    run = MECHANISMS[name].run
    np.testing.assert_array_equal(run(inputs[name], False, SEED), run(inputs[name], False, SEED))


@pytest.mark.parametrize("name", MECHANISMS)
def test_secure_runs_with_the_same_seed_differ(name, inputs):
    run = MECHANISMS[name].run
    assert not np.array_equal(run(inputs[name], True, SEED), run(inputs[name], True, SEED))


@pytest.mark.parametrize("name", MECHANISMS)
def test_secure_draws_come_from_the_os_alone(name, inputs):
    mechanism = MECHANISMS[name]
    with counting_entropy() as entropy, seeded_draws_forbidden():
        mechanism.run(inputs[name], True, SEED)
    assert entropy.stream_bytes >= 8 * mechanism.values
    assert sum(entropy.uniforms) >= mechanism.values
    # every block under a fresh 256-bit key and 96-bit nonce from the OS: no key serves two draws
    assert entropy.blocks >= 1 and entropy.os_bytes >= 44 * entropy.blocks


@pytest.mark.parametrize("name", MECHANISMS)
def test_the_tripwire_catches_seeded_draws(name, inputs):
    with seeded_draws_forbidden(), pytest.raises(SeededDraw):
        MECHANISMS[name].run(inputs[name], False, SEED)


def test_dpsgd_secure_mode_takes_lots_and_noise_from_the_os():
    x, y = _dpsgd_data()
    with counting_entropy() as entropy, seeded_draws_forbidden():
        _dpsgd((x, y), True, SEED)
    # 2 steps: each one coin per record (64), then one block for the weight (15 values) and the bias (3):
    # 4 Box–Muller draws of ceil(18/2) pairs, 2 uniforms a pair. Both are drawn a step ahead on a
    # worker thread, so the draw for a third step may have started before training ended
    coins, blocks = entropy.uniforms.count(64), entropy.uniforms.count(4 * 9 * 2)
    assert 2 <= coins <= 3 and 2 <= blocks <= 3 and coins + blocks == len(entropy.uniforms)


def test_each_secure_normal_rests_on_four_separate_box_muller_pairs(monkeypatch):
    """The defence against the floating-point attack (Holohan & Braghin 2021, §5.1; Opacus' secure mode)
    sums 2n = 4 *independent* normals per value, so every value must depend on 8 distinct uniforms:
    the cosine and sine of one Box–Muller pair sum to a single scaled Box–Muller normal."""
    stream = np.random.default_rng(0).uniform(0.05, 0.95, size=256)

    def replaying(values: np.ndarray) -> tuple[Callable[[int], np.ndarray], Callable[[], int]]:
        """A stand-in for _secure_uniform that replays ``values``, and how many of them it has handed out."""
        position = 0

        def uniform(count: int) -> np.ndarray:
            nonlocal position
            position += count
            return values[position - count:position].copy()
        return uniform, lambda: position

    def normals(values: np.ndarray) -> tuple[np.ndarray, int]:
        uniform, used = replaying(values)
        monkeypatch.setattr(secure_noise, "_secure_uniform", uniform)
        return secure_normal((5,), std=1.0, dtype=torch.float64).numpy(), used()

    base, used = normals(stream)
    depends = np.zeros((5, used), dtype=bool)
    for k in range(used):
        moved = stream.copy()
        moved[k] = 0.05 + (moved[k] + 0.37) % 0.9
        depends[:, k] = normals(moved)[0] != base
    assert (depends.sum(axis=1) >= 8).all(), depends.sum(axis=1)


def test_a_secure_noise_source_holds_no_seeded_generator():
    assert NoiseSource(seed=0, secure=True)._rng is None
    assert NoiseSource(seed=0, secure=False)._rng is not None


# -- statistics of the secure samplers ----------------------------------------------------------------
# (secure_normal's mean and std: tests/library/dpsgd/test_dpsgd.py)

DRAWS = 200_000
P_FLOOR = 1e-5  # a sound sampler fails this once in 100,000 runs; a wrong scale or shape fails it always


def test_secure_normal_is_normal():
    draws = secure_normal((DRAWS,), std=2.5, dtype=torch.float64).numpy()
    assert stats.kstest(draws, stats.norm(scale=2.5).cdf).pvalue > P_FLOOR
    assert np.all(np.isfinite(draws))


def test_secure_laplace_is_laplace():
    scale = 3.0
    draws = secure_laplace(DRAWS, scale=scale)
    assert abs(draws.mean()) < 5 * scale * np.sqrt(2 / DRAWS)
    assert draws.std() == pytest.approx(np.sqrt(2) * scale, rel=0.02)
    assert np.median(np.abs(draws)) == pytest.approx(scale * np.log(2), rel=0.02)
    assert stats.kstest(draws, stats.laplace(scale=scale).cdf).pvalue > P_FLOOR
    assert not np.array_equal(draws[:100], secure_laplace(100, scale=scale))


def test_secure_uniform_has_53_random_bits_in_the_unit_interval():
    draws = secure_uniform(DRAWS)
    assert draws.min() > 0.0 and draws.max() <= 1.0
    scaled = draws * 2.0**53
    assert np.array_equal(scaled, np.round(scaled))  # multiples of 2⁻⁵³
    assert stats.kstest(draws, "uniform").pvalue > P_FLOOR
    assert (scaled % 2 == 1).mean() == pytest.approx(0.5, abs=0.01)  # the lowest bit is random too


def test_secure_coins_sample_clients_at_the_rate():
    sampler = ClientSampler(clients=1000, sample_rate=0.2, sampling="poisson", noise=NoiseSource(seed=0, secure=True))
    counts = [len(sampler.sample()) for _ in range(50)]
    assert np.mean(counts) == pytest.approx(200, abs=5 * np.sqrt(1000 * 0.2 * 0.8 / 50))


def test_the_keystream_is_chacha20s_whatever_the_size_of_the_draw(monkeypatch):
    """_random_bytes feeds one shared block of zeros to the cipher, again and again for a large draw:
    the bytes must be the one keystream of a fresh key and nonce, as if encrypted in one piece."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    fixed = bytes(range(7, 55))
    monkeypatch.setattr(secure_noise.os, "urandom", lambda n: fixed[:n])
    for count in (7, len(secure_noise._ZEROS), 2 * len(secure_noise._ZEROS) + 5):
        cipher = Cipher(algorithms.ChaCha20(fixed[:32], b"\0" * 4 + fixed[:12]), mode=None)
        assert bytes(secure_noise._random_bytes(count)) == cipher.encryptor().update(bytes(count))


def test_secure_normals_are_the_sums_of_the_box_muller_pairs_as_written(monkeypatch):
    """The in-place arithmetic (NumPy's log, torch's sine and cosine in slices) gives, up to rounding,
    the plain form: the cosines and sines interleaved, value k the sum of entries k + jL, j = 0..3, / 2."""
    count, std = 40_001, 1.5  # several of torch's slices
    stream = np.random.default_rng(1).uniform(2.0**-53, 1.0, size=8 * count)
    monkeypatch.setattr(secure_noise, "_secure_uniform", lambda n: stream[:n].copy())
    got = secure_normal((count,), std=std, dtype=torch.float64).numpy()
    pairs = 4 * ((count + 1) // 2)
    radius, angle = np.sqrt(-2.0 * np.log(stream[:pairs])), 2 * np.pi * stream[pairs:2 * pairs]
    normals = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1).reshape(-1)
    expected = normals.reshape(4, -1)[:, :count].sum(0) / 2 * std
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-13)
    assert secure_normal((3, 2), std=std).dtype == torch.float32
