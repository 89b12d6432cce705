"""Data-parallel DP-SGD on 2 processes (gloo, this machine): the clipped sum, the noise and the run are the
single process's. One start of 2 ranks runs every case (starting them is most of the time); the tests read
what each rank saved."""

from __future__ import annotations

import datetime
import os
import socket
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from privpipe.dpsgd import BookKeeping, DpSgdSettings, train_dpsgd, train_dpsgd_distributed
from privpipe.dpsgd.distributed import GroupReducer
from privpipe.dpsgd.train import DpSgdResult, LotRows, PoissonLots, clipped_sum

pytestmark = [
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no torch.distributed (gloo)"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

N, WIDE = 200, 1000
SIGMA, CLIP = 1.5, 2.0  # the noise check's
RUN: dict[str, Any] = dict(noise_multiplier=1.0, max_grad_norm=1.0, lot_size=40, epochs=2, learning_rate=0.5,
                           momentum=0.5, max_physical_batch=16, seed=3)  # 5 lots an epoch, q = 0.2
NOISE_RUN: dict[str, Any] = dict(noise_multiplier=SIGMA, max_grad_norm=CLIP, lot_size=N, epochs=1,
                                 learning_rate=1.0)  # q = 1


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def zero_linear() -> nn.Module:
    model = nn.Linear(WIDE, 10, bias=False)
    nn.init.zeros_(model.weight)
    return model


def data(folder) -> tuple[np.ndarray, np.ndarray]:
    """The set every rank maps (each reads only its share's rows); large inputs, so most gradients are clipped."""
    return np.load(folder / "features.npy", mmap_mode="r"), np.load(folder / "labels.npy", mmap_mode="r")


def rank_main(rank: int, port: int, folder) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    x, y = data(folder)
    out: dict[str, object] = {}

    # (1) one lot's clipped sum: this rank's share, all-reduced (noise of std 0), against the whole lot's here
    model = mlp()
    taps = BookKeeping(model)
    rows = LotRows(x, y, torch.device("cpu"))
    lot = PoissonLots(N, 0.3, secure=False, seed=7).draw()
    reducer = GroupReducer(N, 0.3, noise_std=0.0, shapes=[p.shape for p in taps.parameters], secure=False, seed=0,
                           device=torch.device("cpu"))
    mine = reducer.share(lot)
    sums, _ = clipped_sum(model, taps, rows, mine, max_grad_norm=1.0, clipping="flat")
    out["reduced"] = reducer.noised_sum(sums, torch.float32)
    out["single"], _ = clipped_sum(model, taps, rows, lot, max_grad_norm=1.0, clipping="flat")
    out["lot"], out["mine"] = lot, mine
    taps.close()

    # (2) the noise alone: zero inputs give zero gradients, so one step at lr 1 moves the weights by −noise/(n·q)
    zeros, labels = np.zeros((N, WIDE), dtype=np.float32), np.zeros(N, dtype=np.int64)
    for secure in (False, True):
        result = train_dpsgd_distributed(zero_linear(), zeros, labels,
                                         DpSgdSettings(secure_rng=secure, seed=11, **NOISE_RUN))
        weight = result.model.weight
        assert isinstance(weight, torch.Tensor)
        out[f"noise secure={secure}"] = weight.detach()

    # (3) a short run, seeded and secure
    for secure in (False, True):
        result = train_dpsgd_distributed(mlp(), x, y, DpSgdSettings(**{**RUN, "secure_rng": secure}))
        out[f"run secure={secure}"] = (result.model.state_dict(), result.event, result.history)

    # (4) ranks that disagree on σ: refused on both, before any step
    try:
        train_dpsgd_distributed(mlp(), x, y, DpSgdSettings(**{**RUN, "noise_multiplier": 1.0 + rank}))
    except ValueError as exc:
        out["refused"] = str(exc)
    dist.destroy_process_group()
    torch.save(out, folder / f"rank{rank}.pt")


@dataclass
class Runs:
    ranks: list[dict]  # what each rank saved
    single: DpSgdResult  # train_dpsgd with RUN
    single_noise: DpSgdResult  # train_dpsgd with NOISE_RUN, seed 11


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    folder = tmp_path_factory.mktemp("ranks")
    rng = np.random.default_rng(0)
    np.save(folder / "features.npy", (rng.normal(size=(N, 8)) * 5).astype(np.float32))
    np.save(folder / "labels.npy", rng.integers(0, 3, size=N))
    x, y = (np.asarray(a) for a in data(folder))
    single = train_dpsgd(mlp(), x, y, DpSgdSettings(**RUN))
    single_noise = train_dpsgd(zero_linear(), np.zeros((N, WIDE), dtype=np.float32), np.zeros(N, dtype=np.int64),
                               DpSgdSettings(seed=11, **NOISE_RUN))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # spawned, not forked: a rank forked from pytest inherits its Prefect server's threads and state (one exited 1,
    # silently, after tests/stages/finetune/test_published_charged.py); importing torch and privpipe afresh is most
    # of the time
    torch.multiprocessing.spawn(rank_main, args=(port, folder), nprocs=2, join=True)
    return Runs([torch.load(folder / f"rank{r}.pt", weights_only=False) for r in (0, 1)], single, single_noise)


def test_the_all_reduced_clipped_sum_of_a_lot_is_the_single_process_one(runs):
    first, second = runs.ranks
    assert torch.equal(first["lot"], second["lot"])  # one generator, seeded alike: one lot
    assert len(first["mine"]) and len(second["mine"])
    assert torch.equal(torch.cat([first["mine"], second["mine"]]), first["lot"])  # split by position, all of it
    for out in (first, second):
        for reduced, single in zip(out["reduced"], out["single"]):
            assert torch.allclose(reduced, single, rtol=1e-6, atol=1e-6)
    # clipping was at work: a sum of unclipped gradients would be far larger than C per record
    assert torch.cat([g.flatten() for g in first["single"]]).norm() < 1.0 * len(first["lot"])


@pytest.mark.parametrize("secure", [False, True])
def test_the_noise_is_added_once_with_std_sigma_c(runs, secure):
    first, second = runs.ranks
    step = first[f"noise secure={secure}"]
    assert torch.equal(step, second[f"noise secure={secure}"])
    noise = -step * N  # lr 1, divided by n·q = N
    # one draw has std σC; a draw on each of 2 ranks would give √2·σC (4.24 against 3.0)
    assert noise.std().item() == pytest.approx(SIGMA * CLIP, rel=0.03)
    if not secure:  # rank 0 draws train_dpsgd's noise, and it enters the sum once
        assert torch.equal(runs.single_noise.model.weight.detach(), step)


def test_a_run_is_the_single_process_run_up_to_the_order_of_the_sum(runs):
    (first, second), single = runs.ranks, runs.single
    for secure in (False, True):
        weights, event, history = first[f"run secure={secure}"]
        other_weights, other_event, other_history = second[f"run secure={secure}"]
        assert event == other_event == single.event  # σ, q, steps: the same ε
        assert history == other_history and [h["step"] for h in history] == [h["step"] for h in single.history]
        for name, value in weights.items():
            assert torch.equal(value, other_weights[name])  # every rank took the same steps
            if not secure:
                assert torch.allclose(value, single.model.state_dict()[name], rtol=1e-5, atol=1e-5)
        if not secure:
            assert [h["loss"] for h in history] == pytest.approx([h["loss"] for h in single.history], rel=1e-5)


def test_ranks_that_disagree_on_sigma_are_refused_on_every_rank(runs):
    first, second = runs.ranks
    for out in (first, second):
        assert out.get("refused", "").startswith("the ranks disagree on noise_multiplier (rank 0: 1.0, rank 1: 2.0)")


def test_local_processes_train_as_one_process_does():
    """train_dpsgd_local (finetune.processes) starts its own 2 ranks: the event of train_dpsgd, weights within the
    sum order's rounding, and the model handed back in place."""
    from privpipe.dpsgd import train_dpsgd_local

    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(120, 8)).astype(np.float32), rng.integers(0, 3, 120)
    settings = DpSgdSettings(noise_multiplier=1.0, max_grad_norm=1.0, lot_size=30, epochs=2, learning_rate=0.5, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = train_dpsgd(mlp(), x, y, settings)
    model = mlp()
    together = train_dpsgd_local(2, model, x, y, settings)
    assert together.event == alone.event and together.model is model
    for a, b in zip(together.model.parameters(), alone.model.parameters()):
        assert torch.allclose(a, b, atol=1e-5)
    assert [h["step"] for h in together.history] == [h["step"] for h in alone.history]
    with pytest.raises(ValueError, match="one process is train_dpsgd"):
        train_dpsgd_local(1, mlp(), x, y, settings)
