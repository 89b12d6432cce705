"""train_dpsgd: DP-SGD's loop (Abadi et al. 2016) for every per-example engine.

Each step takes a Poisson sample of the data (every record independently with
probability q), clips every per-example gradient to L2 norm C (flat, or C/√m per
parameter tensor with ``clipping="per_layer"``), sums, adds N(0, σ²C²) and
divides by the *expected* lot size n·q. The ledger event is
``PoissonGaussianEvent(σ, q, steps)``; the sampling is what makes it valid, so it
is always Poisson here.

Engines (``grad_sample_mode``): ``bk`` (book-keeping, privpipe.dpsgd.bookkeeping:
one backward pass; Linear and Conv2d layers) or one of Opacus' (ghost, hooks,
functorch, ew: any layer Opacus knows). With ``bk`` a lot is processed in physical
batches of at most ``max_physical_batch`` records, their clipped sums added before
the one noise draw, so memory no longer grows with the lot and the privacy event
is the same.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from privpipe.dpsgd.arguments import check_privacy_arguments
from privpipe.dpsgd.bookkeeping import BookKeeping, clip_factors
from privpipe.dpsgd.schedule import dpsgd_schedule, learning_rate_at
from privpipe.privacy import PoissonGaussianEvent, secure_normal, secure_uniform

__all__ = ["DpSgdResult", "PoissonLots", "GaussianNoise", "train_dpsgd"]


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
        block = lambda: secure_normal((sum(self.sizes),), std=std, dtype=torch.float64)  # noqa: E731
        self.blocks = _Prefetched(block, executor) if secure and executor else None
        self.block = block

    def draw(self, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        if self.secure:
            flat = (self.blocks.draw() if self.blocks else self.block()).to(dtype=dtype, device=self.device)
        else:
            flat = torch.normal(0.0, self.std, (sum(self.sizes),), generator=self.generator, device=self.device,
                                dtype=dtype)
        return [part.view(shape) for part, shape in zip(flat.split(self.sizes), self.shapes)]


def train_dpsgd(
    model: nn.Module,
    features: np.ndarray,
    labels: np.ndarray,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    lot_size: int,
    epochs: int,
    learning_rate: float,
    lr_schedule: str = "constant",
    lr_end: float = 0.052,
    lr_decay_epochs: int = 10,
    momentum: float = 0.0,
    clipping: str = "flat",
    grad_sample_mode: str = "bk",
    max_physical_batch: int | None = None,
    ema_decay: float = 0.0,
    secure_rng: bool = False,
    seed: int = 0,
    device: torch.device | str = "cpu",
    on_epoch: Callable[[dict[str, float]], None] | None = None,
) -> DpSgdResult:
    """Train ``model`` with DP-SGD; returns it (on the CPU) with the privacy event actually run.

    ε is not computed here: record ``result.event`` in a :class:`privpipe.privacy.Ledger`.
    With ``ema_decay`` > 0 the returned weights are an exponential moving average of the
    iterates, updated after every step (post-processing of the private iterates: free).
    """
    check_privacy_arguments(noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm, clipping=clipping,
                            grad_sample_mode=grad_sample_mode, max_physical_batch=max_physical_batch,
                            ema_decay=ema_decay)
    schedule = dpsgd_schedule(n=len(features), lot_size=lot_size, epochs=epochs)
    if not secure_rng:
        warnings.warn("DP-SGD noise and lot sampling come from PRNGs seeded with the run's seed "
                      "(privacy.secure_rng: false): reproducible for research, but whoever knows the seed can "
                      "undo the noise; use secure_rng for anything released", stacklevel=2)
    device = torch.device(device)
    lr_at = lambda step: learning_rate_at(step / schedule.steps_per_epoch, start=learning_rate,  # noqa: E731
                                          schedule=lr_schedule, end=lr_end, decay_epochs=lr_decay_epochs,
                                          epochs=epochs)
    model.to(device).train()  # a model handed over from an earlier stage (the student) arrives in eval mode
    if grad_sample_mode == "bk":
        history = _train_bookkeeping(model, features, labels, schedule=schedule, lr_at=lr_at,
                                     noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
                                     learning_rate=learning_rate, momentum=momentum, clipping=clipping,
                                     max_physical_batch=max_physical_batch, ema_decay=ema_decay,
                                     secure_rng=secure_rng, seed=seed, device=device, on_epoch=on_epoch)
        trained = model
    else:
        trained, history = _train_opacus(model, features, labels, lr_at=lr_at, noise_multiplier=noise_multiplier,
                                         max_grad_norm=max_grad_norm, lot_size=lot_size, epochs=epochs,
                                         learning_rate=learning_rate, momentum=momentum, clipping=clipping,
                                         grad_sample_mode=grad_sample_mode, secure_rng=secure_rng, seed=seed,
                                         device=device, on_epoch=on_epoch)
    return DpSgdResult(model=trained.cpu().eval(), event=schedule.event(noise_multiplier=noise_multiplier),
                       history=history)


def _train_bookkeeping(model: nn.Module, features: np.ndarray, labels: np.ndarray, *, schedule, lr_at,
                       noise_multiplier: float, max_grad_norm: float, learning_rate: float, momentum: float,
                       clipping: str, max_physical_batch: int | None, ema_decay: float, secure_rng: bool,
                       seed: int, device: torch.device, on_epoch) -> list[dict[str, float]]:
    x = torch.as_tensor(features, dtype=torch.float32).to(device)
    y = torch.as_tensor(labels, dtype=torch.long).to(device)
    taps = BookKeeping(model)  # refuses a model with layers it cannot clip, before any step
    params = taps.parameters
    optimizer = torch.optim.SGD(params, lr=learning_rate, momentum=momentum)
    # secure draws are made one step ahead on a worker thread where a core is left for it, else inline;
    # seeded ones inline (they are cheap)
    prefetch = secure_rng and _spare_core()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpsgd-noise") if prefetch else None
    # which records form each lot must be as secret as the noise: both follow run.seed, or both the OS
    lots = PoissonLots(len(x), schedule.sample_rate, secure=secure_rng, seed=seed, executor=executor)
    noise = GaussianNoise(noise_multiplier * max_grad_norm, [p.shape for p in params], secure=secure_rng,
                          seed=seed + 1, device=device, executor=executor)
    expected_lot = len(x) * schedule.sample_rate  # the average, not the drawn size: that would leak it
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
                lot = lots.draw().to(device)
                physical = max_physical_batch or max(len(lot), 1)
                for start in range(0, len(lot), physical):
                    part = lot[start:start + physical]
                    loss = F.cross_entropy(model(x[part]), y[part], reduction="sum")
                    loss.backward()
                    taps.add_clipped(clip_factors(taps.squared_norms(), max_grad_norm=max_grad_norm,
                                                  clipping=clipping))
                    total_loss += float(loss.detach())
                    examples += len(part)
                for p, z in zip(params, noise.draw(params[0].dtype)):
                    summed = getattr(p, "summed_grad", None)
                    p.grad = (z if summed is None else z.add_(summed)).div_(expected_lot)
                    p.summed_grad = None  # type: ignore[attr-defined]  # (Opacus' run-time attribute, see bookkeeping)
                optimizer.step()
                step += 1
                if average is not None:
                    with torch.no_grad():
                        for a, p in zip(average, params):
                            a.lerp_(p, 1.0 - ema_decay)
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


def _train_opacus(model: nn.Module, features: np.ndarray, labels: np.ndarray, *, lr_at, noise_multiplier: float,
                  max_grad_norm: float, lot_size: int, epochs: int, learning_rate: float, momentum: float,
                  clipping: str, grad_sample_mode: str, secure_rng: bool, seed: int, device: torch.device,
                  on_epoch) -> tuple[nn.Module, list[dict[str, float]]]:
    # deferred: Opacus takes 1–1.5 s to import, and only its engines (not bk, the default) need it
    from privpipe.dpsgd.opacus_engine import make_private_training, strip_opacus

    run = make_private_training(
        model, features, labels, noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
        lot_size=lot_size, epochs=epochs, learning_rate=learning_rate, momentum=momentum, clipping=clipping,
        grad_sample_mode=grad_sample_mode, secure_rng=secure_rng, seed=seed,
    )
    history: list[dict[str, float]] = []
    step = 0
    run.model.train()
    for epoch in range(epochs):
        total_loss, batches = 0.0, 0
        for x, y in run.loader:
            lr = lr_at(step)
            for group in run.optimizer.param_groups:
                group["lr"] = lr
            run.optimizer.zero_grad()
            loss = run.criterion(run.model(x.to(device)), y.to(device))
            loss.backward()
            run.optimizer.step()
            step += 1
            if len(y):
                total_loss += float(loss.detach())
                batches += 1
        record = {"epoch": epoch + 1, "step": step, "loss": total_loss / max(batches, 1), "lr": lr}
        history.append(record)
        if on_epoch is not None:
            on_epoch(record)

    for cleanup in ("remove_hooks", "del_grad_sample"):
        if hasattr(run.model, cleanup):
            getattr(run.model, cleanup)()
    return strip_opacus(getattr(run.model, "_module", run.model)), history
