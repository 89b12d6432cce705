"""Data-parallel DP-SGD over a torch.distributed process group (gloo on CPUs, NCCL on GPUs: the same code).

The mechanism is the single-process one, so the ledger event (and ε) is too: each step is one Poisson lot
over all n records, the same on every rank (seeded: the same generator on each; secure: rank 0's coins from
the OS, sent to the others, since whom a lot holds must stay as secret as the noise); each rank clips the
gradients of its share of the lot (the lot split by position), reading only those rows of its (memory-mapped)
arrays; the clipped sums are all-reduced with N(0, σ²C²) added once, by rank 0, to its own; every rank divides
by n·q and takes the same step, so the models stay equal. With ``seed`` s the run draws the lots and the noise
of ``train_dpsgd`` with seed s: the weights agree with it up to the order of the sum.

    torch.distributed.init_process_group("gloo")   # each rank: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    result = train_dpsgd_distributed(model, np.load("features.npy", mmap_mode="r"), labels, settings)

``DataParallelBookKeeping`` is the engine (a privpipe.dpsgd.engines.DpSgdEngine) for one rank of a group.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
import tempfile
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.multiprocessing.spawn import ProcessContext, ProcessRaisedException, start_processes

from privpipe.dpsgd.engines import DpSgdEngine
from privpipe.dpsgd.settings import DpSgdSettings
from privpipe.dpsgd.train import (
    DpSgdResult,
    GaussianNoise,
    LotRows,
    OnEpoch,
    PoissonLots,
    plan_dpsgd,
    train_bookkeeping,
)

__all__ = ["GroupReducer", "DataParallelBookKeeping", "train_dpsgd_distributed", "train_dpsgd_local"]

# torch leaves torch.multiprocessing.spawn unannotated: start_processes as it documents it (a context where join
# is false, else None)
_start_processes: Callable[..., ProcessContext | None] = start_processes


class GroupReducer:
    """A step's exchanges (privpipe.dpsgd.train.Reducer) for one rank of ``group``."""

    def __init__(self, n: int, sample_rate: float, *, noise_std: float, shapes: list[torch.Size], secure: bool,
                 seed: int, device: torch.device, executor: ThreadPoolExecutor | None = None,
                 group: dist.ProcessGroup | None = None) -> None:
        self.group, self.secure, self.shapes, self.device = group, secure, shapes, device
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        # gloo reduces CPU tensors; NCCL those on the rank's GPU
        self.wire = device if dist.get_backend(group) == "nccl" else torch.device("cpu")
        lead = self.rank == 0
        # the generators (and seeds) of LotReducer, on rank 0, so a seeded run draws train_dpsgd's lots and noise
        self.lots = PoissonLots(n, sample_rate, secure=secure, seed=seed, executor=executor) \
            if lead or not secure else None
        self.noise = GaussianNoise(noise_std, shapes, secure=secure, seed=seed + 1, device=device,
                                   executor=executor) if lead else None

    def draw_lot(self) -> torch.Tensor:
        if not self.secure:  # every rank's generator is seeded alike: the same lot, nothing sent
            assert self.lots is not None
            return self.lots.draw()
        size = torch.zeros(1, dtype=torch.int64, device=self.wire)
        lot = None
        if self.lots is not None:
            lot = self.lots.draw().to(self.wire)
            size[0] = len(lot)
        dist.broadcast(size, group=self.group, group_src=0)
        if lot is None:
            lot = torch.empty(int(size), dtype=torch.int64, device=self.wire)
        if len(lot):
            dist.broadcast(lot, group=self.group, group_src=0)
        return lot

    def share(self, lot: torch.Tensor) -> torch.Tensor:
        """This rank's records of the lot: one of ``world`` runs of consecutive positions (sizes differ by ≤ 1)."""
        return torch.tensor_split(lot, self.world)[self.rank]

    def noised_sum(self, sums: list[torch.Tensor | None], dtype: torch.dtype) -> list[torch.Tensor]:
        parts = [torch.zeros(shape, dtype=dtype, device=self.device) if summed is None else summed
                 for summed, shape in zip(sums, self.shapes)]
        if self.noise is not None:  # rank 0 alone: the noise enters the sum once
            parts = [z.add_(part) for z, part in zip(self.noise.draw(dtype), parts)]
        flat = torch.cat([part.reshape(-1) for part in parts]).to(self.wire)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        flat = flat.to(self.device)
        return [part.view(shape) for part, shape in zip(torch.split(flat, self.sizes), self.shapes)]

    def totals(self, loss: float, examples: int) -> tuple[float, int]:
        both = torch.tensor([loss, examples], dtype=torch.float64, device=self.wire)
        dist.all_reduce(both, op=dist.ReduceOp.SUM, group=self.group)
        return float(both[0]), int(both[1])


def _refuse_other_engines(settings: DpSgdSettings) -> None:
    if settings.grad_sample_mode != "bk":
        raise ValueError(f"data-parallel DP-SGD runs grad_sample_mode bk, got {settings.grad_sample_mode!r}")


class DataParallelBookKeeping:
    """bk's loop (privpipe.dpsgd.train.BookKeepingEngine) with the lot's clipping shared among the ranks of
    ``group`` (default: the initialised default group); each rank trains with its own engine, the same settings
    and its own copy of the data (all n records; memory-mapped, each reads only its share's rows)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group

    def train(self, model: nn.Module, features: np.ndarray, labels: np.ndarray, settings: DpSgdSettings, *,
              device: torch.device, on_epoch: OnEpoch | None = None) -> DpSgdResult:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("train_dpsgd_distributed needs torch.distributed.init_process_group first")
        # every rank sees every rank's settings before any can refuse on its own (a lone refusal would hang the
        # rest); the size of a physical batch is each rank's own affair (it changes neither the steps nor ε)
        agreed = {name: value for name, value in dataclasses.asdict(settings).items() if name != "max_physical_batch"}
        check_settings_agree({"n": len(features), "features": tuple(features.shape[1:]), **agreed,
                              "parameters": [tuple(p.shape) for p in model.parameters()]}, group=self.group)
        _refuse_other_engines(settings)
        schedule, lr_at = plan_dpsgd(len(features), settings)
        model.to(device).train()
        _broadcast_model(model, device, self.group)
        history = train_bookkeeping(model, LotRows(features, labels, device), settings, schedule=schedule,
                                    lr_at=lr_at, device=device, on_epoch=on_epoch,
                                    reducer=partial(GroupReducer, group=self.group))
        return DpSgdResult(model=model.cpu().eval(), event=schedule.event(noise_multiplier=settings.noise_multiplier),
                           history=history)


def train_dpsgd_distributed(model: nn.Module, features: np.ndarray, labels: np.ndarray, settings: DpSgdSettings, *,
                            device: torch.device | str = "cpu", on_epoch: OnEpoch | None = None,
                            group: dist.ProcessGroup | None = None) -> DpSgdResult:
    """``train_dpsgd`` (engine bk) with the lot's clipping shared among the ranks of ``group`` (default: the
    initialised default group); every rank calls it with the same settings and its own copy of the data (all n
    records; memory-mapped, each reads only its share's rows). Returns the same model and event on every rank.
    ``on_epoch`` runs on every rank, with the whole lot's loss."""
    engine: DpSgdEngine = DataParallelBookKeeping(group)
    return engine.train(model, features, labels, settings, device=torch.device(device), on_epoch=on_epoch)


def check_settings_agree(settings: dict[str, object], *, group: dist.ProcessGroup | None = None) -> None:
    """ValueError on every rank, naming the first setting the ranks of ``group`` disagree on."""
    gathered: list[dict[str, object] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, settings, group=group)
    for name in settings:
        values = [each.get(name) if each is not None else None for each in gathered]
        if any(value != values[0] for value in values):
            said = ", ".join(f"rank {rank}: {value!r}" for rank, value in enumerate(values))
            raise ValueError(f"the ranks disagree on {name} ({said}): one DP-SGD run, and its ε, needs one value")


def _broadcast_model(model: nn.Module, device: torch.device, group: dist.ProcessGroup | None) -> None:
    """Rank 0's weights on every rank (as DistributedDataParallel starts): equal steps then keep them equal."""
    wire = device if dist.get_backend(group) == "nccl" else torch.device("cpu")
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            sent = tensor.detach().to(wire)
            dist.broadcast(sent, group=group, group_src=0)
            tensor.copy_(sent)


def train_dpsgd_local(processes: int, model: nn.Module, features: np.ndarray, labels: np.ndarray,
                      settings: DpSgdSettings, *, torch_threads: int = 1) -> DpSgdResult:
    """``train_dpsgd_distributed`` over ``processes`` processes of this machine (gloo on 127.0.0.1, CPU ranks): the
    model and the arrays are written once to a private temporary folder, which every rank memory-maps (each reads
    only its share's rows), and rank 0's result is returned (no ``on_epoch``: the history says what each epoch
    did). Each rank runs ``torch_threads`` threads. Across machines, call train_dpsgd_distributed on each
    (torchrun sets the group up)."""
    if processes < 2:
        raise ValueError(f"processes: {processes}; one process is train_dpsgd")
    _refuse_other_engines(settings)  # here, not on each rank
    with tempfile.TemporaryDirectory(prefix="privpipe-dpsgd-") as tmp:  # 0700: it holds the records
        folder = Path(tmp)
        np.save(folder / "features.npy", np.ascontiguousarray(features))
        np.save(folder / "labels.npy", np.ascontiguousarray(labels))
        torch.save(model, folder / "model.pt")
        with socket.socket() as probe:  # a free port for the group's rendezvous
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        try:
            _start_processes(_local_rank, args=(processes, port, str(folder), torch_threads, settings),
                             nprocs=processes, join=True, start_method="spawn")
        except ProcessRaisedException as exc:  # the rank's own error, its last line first
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            raise RuntimeError(f"DP-SGD on {processes} processes: {lines[-1] if lines else exc}") from None
        done = torch.load(folder / "result.pt", weights_only=False)
    model.load_state_dict(done["state"])
    return DpSgdResult(model=model.cpu().eval(), event=done["event"], history=done["history"])


def _local_rank(rank: int, processes: int, port: int, folder: str, torch_threads: int,
                settings: DpSgdSettings) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(torch_threads)
    dist.init_process_group("gloo", rank=rank, world_size=processes, timeout=datetime.timedelta(minutes=10))
    try:
        where = Path(folder)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the caller has warned of seeded noise once, not once a rank
            result = train_dpsgd_distributed(torch.load(where / "model.pt", weights_only=False),
                                             np.load(where / "features.npy", mmap_mode="r"),
                                             np.load(where / "labels.npy", mmap_mode="r"), settings)
        if rank == 0:
            torch.save({"state": result.model.state_dict(), "event": result.event, "history": result.history},
                       where / "result.pt")
    finally:
        dist.destroy_process_group()
