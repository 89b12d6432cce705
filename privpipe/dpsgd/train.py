"""DP-SGD's loop (Abadi et al. 2016), and the engine that runs it: book-keeping (``grad_sample_mode`` bk).

Each step takes a Poisson sample of the data (every record independently with
probability q), clips every per-example gradient to L2 norm C (flat, or C/√m per
parameter tensor with ``clipping="per_layer"``), sums, adds N(0, σ²C²) and
divides by the *expected* lot size n·q. The ledger event is
``PoissonGaussianEvent(σ, q, steps)``; the sampling is what makes it valid, so it
is always Poisson here.

``BookKeepingEngine`` clips with privpipe.dpsgd.bookkeeping (one backward pass;
Linear and Conv2d layers); Opacus' engines (privpipe.dpsgd.opacus_engine) take any
layer Opacus knows, and ``train_dpsgd`` (privpipe.dpsgd.engines) runs the one the
settings name. A lot is processed in physical batches of at most
``max_physical_batch`` records, their clipped sums added before the one noise draw,
so memory no longer grows with the lot and the privacy event is the same; a
memory-mapped array (``np.load(..., mmap_mode="r")``) is read a physical batch at a
time (``LotRows``), so a set larger than memory trains too. The step is shared:
``clipped_sum`` of a lot's records, and a ``Reducer`` that draws the lot and adds
the noise: ``LotReducer`` in this process alone, ``GroupReducer``
(privpipe.dpsgd.distributed) over a process group, summing the ranks' clipped sums.
"""

from __future__ import annotations

import mmap
import os
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from privpipe.data.records import float_features
from privpipe.dpsgd.bookkeeping import BookKeeping, clip_factors
from privpipe.dpsgd.schedule import DpSgdSchedule, dpsgd_schedule, learning_rate_at
from privpipe.dpsgd.settings import DpSgdSettings
from privpipe.privacy import PoissonGaussianEvent, secure_normal, secure_uniform

__all__ = ["DpSgdResult", "OnEpoch", "PoissonLots", "GaussianNoise", "LotRows", "clipped_sum", "Reducer",
           "LotReducer", "plan_dpsgd", "train_bookkeeping", "BookKeepingEngine"]

#: what an engine calls after each epoch, with the epoch's record (epoch, step, loss, lr)
OnEpoch = Callable[[dict[str, float]], None]


@dataclass
class DpSgdResult:
    model: nn.Module  # the trained module, on the CPU, free of any engine's hooks
    event: PoissonGaussianEvent  # what was actually run, for the ledger
    history: list[dict[str, float]] = field(default_factory=list)  # per epoch: epoch, step, loss, lr


_T = TypeVar("_T")


class _Prefetched(Generic[_T]):
    """``draw()`` returns ``make()``'s result and starts the next one on a worker thread, so that
    drawing secure randomness (a ChaCha20 block, Box–Muller in NumPy: both release the GIL)
    overlaps the step's forward and backward passes. Values are never reused: each is handed out
    once, and a draw never enters torch's thread pool (privpipe.privacy.secure_noise._SLICE). Used
    only where a core is left for it (``_spare_core``)."""

    def __init__(self, make: Callable[[], _T], executor: ThreadPoolExecutor) -> None:
        self.make, self.executor = make, executor
        self.next = executor.submit(make)

    def draw(self) -> _T:
        value = self.next.result()
        self.next = self.executor.submit(self.make)
        return value


def _spare_core() -> bool:
    """Whether this process may run on more cores than torch's intra-op threads take, so that a worker
    drawing secure noise a step ahead has a core of its own. Without one it only takes turns with the
    step's threads (a 2-core host at 2 torch threads ran the MLP's steps ~2× slower than seeded), and
    drawing inline, between steps, costs no more than the draw itself."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (no affinity outside Linux)
        cores = os.cpu_count() or 1
    return cores > torch.get_num_threads()


class PoissonLots:
    """Lots of a Poisson sample: every record independently with probability q. The coins come
    from a generator seeded with ``seed`` or, with ``secure``, from the OS CSPRNG (whom a lot
    holds must stay as secret as the noise, or subsampling amplifies nothing)."""

    def __init__(self, n: int, sample_rate: float, *, secure: bool, seed: int,
                 executor: ThreadPoolExecutor | None = None) -> None:
        self.n, self.sample_rate, self.secure = n, sample_rate, secure
        self.generator = None if secure else torch.Generator().manual_seed(seed)
        self.coins = _Prefetched(lambda: secure_uniform(n), executor) if secure and executor else None

    def draw(self) -> torch.Tensor:
        if self.secure:
            coins = torch.from_numpy(self.coins.draw() if self.coins else secure_uniform(self.n))
        else:
            coins = torch.rand(self.n, generator=self.generator)
        return (coins < self.sample_rate).nonzero().reshape(-1)


class GaussianNoise:
    """N(0, std²) noise for every parameter tensor of a step, in one draw: from a generator seeded
    with ``seed`` on the training device, or from the OS CSPRNG (one block for all tensors, drawn
    ahead on a worker thread when an executor is given)."""

    def __init__(self, std: float, shapes: list[torch.Size], *, secure: bool, seed: int, device: torch.device,
                 executor: ThreadPoolExecutor | None = None) -> None:
        self.std, self.shapes, self.secure, self.device = std, shapes, secure, device
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        self.generator = None if secure else torch.Generator(device=device).manual_seed(seed)

        def block() -> torch.Tensor:
            return secure_normal((sum(self.sizes),), std=std, dtype=torch.float64)

        self.blocks = _Prefetched(block, executor) if secure and executor else None
        self.block = block

    def draw(self, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        if self.secure:
            flat = (self.blocks.draw() if self.blocks else self.block()).to(dtype=dtype, device=self.device)
        else:
            flat = torch.normal(0.0, self.std, (sum(self.sizes),), generator=self.generator, device=self.device,
                                dtype=dtype)
        return [part.view(shape) for part, shape in zip(torch.split(flat, self.sizes), self.shapes)]


class LotRows:
    """The records a lot names, as tensors on the training device. An array in memory becomes tensors once (no
    copy where it is float32 on the CPU); a memory-mapped one (``np.load(..., mmap_mode="r")``, np.memmap) is
    read a physical batch at a time, only the rows the batch names, and converted then, so memory follows the
    batch, not the set. Both give the same tensors, bit for bit: the same conversion, on fewer rows. Pixels stored
    as bytes (an image folder's prepared set) are converted to their floats the same way, per batch if mapped."""

    def __init__(self, features: np.ndarray, labels: np.ndarray, device: torch.device) -> None:
        self.features, self.labels, self.device = features, labels, device
        self.mapped = _memory_mapped(features) or _memory_mapped(labels)
        if not self.mapped:  # the fast path: one conversion, then torch's own gather per batch
            self.x = torch.as_tensor(float_features(features), dtype=torch.float32).to(device)
            self.y = torch.as_tensor(labels, dtype=torch.long).to(device)

    def __len__(self) -> int:
        return len(self.features)

    def take(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(features, labels) of the records at ``index`` (positions, sorted as a lot's are)."""
        if not self.mapped:
            index = index.to(self.x.device)
            return self.x[index], self.y[index]
        rows = index.cpu().numpy()
        return (torch.as_tensor(float_features(self.features[rows]), dtype=torch.float32).to(self.device),
                torch.as_tensor(self.labels[rows], dtype=torch.long).to(self.device))


def _memory_mapped(array: np.ndarray) -> bool:
    """Whether ``array``, or an array it is a view of, lies in a mapped file."""
    base: object = array
    while base is not None:
        if isinstance(base, np.memmap | mmap.mmap):
            return True
        base = getattr(base, "base", None)
    return False


def clipped_sum(model: nn.Module, taps: BookKeeping, rows: LotRows, lot: torch.Tensor, *, max_grad_norm: float,
                clipping: str, max_physical_batch: int | None = None) -> tuple[list[torch.Tensor | None], list[float]]:
    """Σ of the clipped gradients of the records at ``lot``, per parameter tensor of ``taps`` (None where the lot
    is empty), in physical batches of at most ``max_physical_batch`` records; and each batch's summed loss."""
    physical = max_physical_batch or max(len(lot), 1)
    losses = []
    for start in range(0, len(lot), physical):
        part = lot[start:start + physical]
        x, y = rows.take(part)
        with taps.batch(part):
            loss = F.cross_entropy(model(x), y, reduction="sum")
            torch.autograd.backward(loss)  # (loss.backward(), which torch leaves unannotated)
            squared = taps.squared_norms()
        taps.add_clipped(clip_factors(squared, max_grad_norm=max_grad_norm, clipping=clipping))
        losses.append(float(loss.detach()))
    sums = []
    for p in taps.parameters:
        sums.append(getattr(p, "summed_grad", None))
        p.summed_grad = None  # type: ignore[attr-defined]  # (Opacus' run-time attribute, see bookkeeping)
    return sums, losses


class Reducer(Protocol):
    """A step's exchanges: which records the lot holds, which of them this process clips, and the noised sum
    of the lot's clipped gradients (the same on every process that trains the model)."""

    def draw_lot(self) -> torch.Tensor: ...

    def share(self, lot: torch.Tensor) -> torch.Tensor: ...

    def noised_sum(self, sums: list[torch.Tensor | None], dtype: torch.dtype) -> list[torch.Tensor]: ...

    def totals(self, loss: float, examples: int) -> tuple[float, int]: ...


class LotReducer:
    """This process alone: it draws every lot and the noise, and clips the whole lot. Which records form each lot
    must be as secret as the noise: both follow ``seed`` (the noise ``seed`` + 1), or both the OS."""

    def __init__(self, n: int, sample_rate: float, *, noise_std: float, shapes: list[torch.Size], secure: bool,
                 seed: int, device: torch.device, executor: ThreadPoolExecutor | None = None) -> None:
        self.lots = PoissonLots(n, sample_rate, secure=secure, seed=seed, executor=executor)
        self.noise = GaussianNoise(noise_std, shapes, secure=secure, seed=seed + 1, device=device, executor=executor)

    def draw_lot(self) -> torch.Tensor:
        return self.lots.draw()

    def share(self, lot: torch.Tensor) -> torch.Tensor:
        return lot

    def noised_sum(self, sums: list[torch.Tensor | None], dtype: torch.dtype) -> list[torch.Tensor]:
        return [z if summed is None else z.add_(summed) for z, summed in zip(self.noise.draw(dtype), sums)]

    def totals(self, loss: float, examples: int) -> tuple[float, int]:
        return loss, examples


def plan_dpsgd(n: int, settings: DpSgdSettings) -> tuple[DpSgdSchedule, Callable[[int], float]]:
    """The schedule of a run over ``n`` records and its learning rate at each step; warns where the randomness
    is seeded (the warning points at whoever called train_dpsgd, which called the engine, which calls this)."""
    schedule = dpsgd_schedule(n=n, lot_size=settings.lot_size, epochs=settings.epochs)
    if not settings.secure_rng:
        warnings.warn("DP-SGD noise and lot sampling come from PRNGs seeded with the run's seed "
                      "(privacy.secure_rng: false): reproducible for research, but whoever knows the seed can "
                      "undo the noise; use secure_rng for anything released", stacklevel=4)

    def lr_at(step: int) -> float:
        return learning_rate_at(step / schedule.steps_per_epoch, start=settings.learning_rate,
                                schedule=settings.lr_schedule, end=settings.lr_end,
                                decay_epochs=settings.lr_decay_epochs, epochs=settings.epochs)

    return schedule, lr_at


def train_bookkeeping(model: nn.Module, rows: LotRows, settings: DpSgdSettings, *, schedule: DpSgdSchedule,
                      lr_at: Callable[[int], float], device: torch.device, on_epoch: OnEpoch | None,
                      reducer: Callable[..., Reducer] = LotReducer) -> list[dict[str, float]]:
    """The bk engine's loop over ``schedule``'s steps (``settings`` checked by the caller); ``reducer`` makes the
    step's exchanges (``LotReducer``'s arguments): this process alone, or a process group's share."""
    max_grad_norm, secure_rng, ema_decay = settings.max_grad_norm, settings.secure_rng, settings.ema_decay
    # refuses a model with layers it cannot clip, before any step; a set in memory lets a first convolution keep
    # each record's patch Gram matrix (no larger than the record's input: see _GramCache's use), a mapped one not
    taps = BookKeeping(model, records=None if rows.mapped else len(rows))
    params = taps.parameters
    optimizer = torch.optim.SGD(params, lr=settings.learning_rate, momentum=settings.momentum)
    # secure draws are made one step ahead on a worker thread where a core is left for it, else inline;
    # seeded ones inline (they are cheap)
    prefetch = secure_rng and _spare_core()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpsgd-noise") if prefetch else None
    exchange = reducer(len(rows), schedule.sample_rate, noise_std=settings.noise_multiplier * max_grad_norm,
                       shapes=[p.shape for p in params], secure=secure_rng, seed=settings.seed, device=device,
                       executor=executor)
    expected_lot = len(rows) * schedule.sample_rate  # the average, not the drawn size: that would leak it
    average = [p.detach().clone() for p in params] if ema_decay > 0 else None
    history: list[dict[str, float]] = []
    step = 0
    try:
        for epoch in range(schedule.epochs):
            total_loss, examples = 0.0, 0
            for _ in range(schedule.steps_per_epoch):
                lr = lr_at(step)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                mine = exchange.share(exchange.draw_lot())
                sums, losses = clipped_sum(model, taps, rows, mine, max_grad_norm=max_grad_norm,
                                           clipping=settings.clipping, max_physical_batch=settings.max_physical_batch)
                for loss in losses:  # one at a time, in order: the history is the same to the last bit
                    total_loss += loss
                examples += len(mine)
                for p, noised in zip(params, exchange.noised_sum(sums, params[0].dtype)):
                    p.grad = noised.div_(expected_lot)
                optimizer.step()
                step += 1
                if average is not None:
                    with torch.no_grad():
                        for a, p in zip(average, params):
                            a.lerp_(p, 1.0 - ema_decay)
            total_loss, examples = exchange.totals(total_loss, examples)
            record = {"epoch": epoch + 1, "step": step, "loss": total_loss / max(examples, 1), "lr": lr}
            history.append(record)
            if on_epoch is not None:
                on_epoch(record)
        if average is not None:
            with torch.no_grad():
                for p, a in zip(params, average):
                    p.copy_(a)
    finally:
        taps.close()
        for p in params:
            p.grad = None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
    return history


class BookKeepingEngine:
    """``grad_sample_mode`` bk (a privpipe.dpsgd.engines.DpSgdEngine): per-example clipping by book-keeping in
    one backward pass, lots in physical batches, weight averaging; this process alone."""

    def train(self, model: nn.Module, features: np.ndarray, labels: np.ndarray, settings: DpSgdSettings, *,
              device: torch.device, on_epoch: OnEpoch | None = None) -> DpSgdResult:
        # (bk runs every setting DpSgdSettings takes: nothing of its own to refuse)
        schedule, lr_at = plan_dpsgd(len(features), settings)
        model.to(device).train()  # a model handed over from an earlier stage (the student) arrives in eval mode
        history = train_bookkeeping(model, LotRows(features, labels, device), settings, schedule=schedule,
                                    lr_at=lr_at, device=device, on_epoch=on_epoch)
        return DpSgdResult(model=model.cpu().eval(), event=schedule.event(noise_multiplier=settings.noise_multiplier),
                           history=history)
