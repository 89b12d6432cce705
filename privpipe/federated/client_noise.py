"""Client-side noise: each client runs DP-SGD on its own records, so what it sends is already private.

    delta, event = private_local_update(model, tensors, start=w, local=local, noise=noise, seed=s)

The trust model of the DP federated BERT seed: the server is honest but curious, so it must
never see an unprotected update. Each sampled client trains from the global weights with DP-SGD
(Poisson lots at rate q_k = 1/ceil(n_k/L), per-example clipping to C, N(0, σ²C²) on every lot's
sum: privpipe.dpsgd), and the server only averages. The unit of privacy is one *record*:

- one round of client k is ``PoissonGaussianEvent(σ, q_k, E·ceil(n_k/L))``;
- a record lives in one client only, so its cost is its own client's rounds, composed: a client
  that took part in r rounds spent r of them (participation is drawn from coins independent of
  the data, so r may be published);
- the run's record-level ε is the worst client's; everyone else's is at most that.

Assumptions, as DP-SGD's own: each client's record count n_k is public (the server learns it
anyway from the steps a client takes), which fixes its q_k. The guarantee holds against the
server and anyone who sees the updates or the model; it says nothing about whole clients (a
client is a group of n_k records), which is what the server-noise mode protects instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from privpipe.dpsgd.engines import train_dpsgd
from privpipe.dpsgd.schedule import DpSgdSchedule, dpsgd_schedule
from privpipe.dpsgd.settings import DpSgdSettings
from privpipe.federated.local import LocalConfig, load_vector, trainable_vector
from privpipe.privacy import Event, Ledger, PoissonGaussianEvent, compute_epsilon

__all__ = ["ClientNoise", "client_schedule", "private_local_update", "worst_client_event"]


@dataclass(frozen=True)
class ClientNoise:
    """Each client's DP-SGD: noise multiplier σ and per-example clipping bound C."""

    noise_multiplier: float
    clip_norm: float
    secure_rng: bool = False

    def __post_init__(self) -> None:
        if not (self.noise_multiplier > 0 and self.clip_norm > 0):
            raise ValueError("client noise needs noise_multiplier > 0 and clip_norm > 0")


def client_schedule(records: int, local: LocalConfig) -> DpSgdSchedule:
    """One round of a client with ``records`` records: E epochs of Poisson lots of expected size L
    (a client smaller than L takes every record each step, q = 1)."""
    return dpsgd_schedule(n=records, lot_size=min(local.batch_size, records), epochs=local.epochs)


def private_local_update(model: nn.Module, tensors: tuple[torch.Tensor, torch.Tensor], *, start: np.ndarray,
                         local: LocalConfig, noise: ClientNoise, seed: int,
                         device: torch.device | str = "cpu") -> tuple[np.ndarray, PoissonGaussianEvent]:
    """DP-SGD on one client's (inputs, labels) from ``start``; returns ``w_local − start`` and the
    round's record-level event for this client."""
    if local.prox_mu > 0:
        raise ValueError("prox_mu: FedProx's proximal term is not part of the client's DP-SGD (use 0 with "
                         "client noise)")
    inputs, labels = tensors
    if len(labels) == 0:
        raise ValueError("a client with no records has nothing to train on")
    load_vector(model, start)
    settings = DpSgdSettings(noise_multiplier=noise.noise_multiplier, max_grad_norm=noise.clip_norm,
                             lot_size=min(local.batch_size, len(labels)), epochs=local.epochs,
                             learning_rate=local.learning_rate, secure_rng=noise.secure_rng, seed=seed)
    result = train_dpsgd(model, inputs.numpy(), labels.numpy(), settings, device=device)
    update = trainable_vector(result.model) - np.asarray(start, dtype=np.float32)
    model.to(device)  # train_dpsgd hands the module back on the CPU; the caller's copy stays where it was
    return update, result.event


def _most_rounds_by_schedule(sizes: Sequence[int], rounds_taken: Sequence[int] | np.ndarray,
                             local: LocalConfig) -> dict[DpSgdSchedule, int]:
    """For each distinct round schedule (clients with the same ceil(n_k/L) run the same one), the most
    rounds any of its clients took part in: the only candidates for the worst client."""
    most: dict[DpSgdSchedule, int] = {}
    for n, r in zip(sizes, rounds_taken):
        if r > 0:
            schedule = client_schedule(int(n), local)
            most[schedule] = max(most.get(schedule, 0), int(r))
    return most


def worst_client_event(*, sizes: Sequence[int], rounds_taken: Sequence[int] | np.ndarray, local: LocalConfig,
                       noise_multiplier: float, ledger: Ledger, stage: str) -> Event | None:
    """The event of the client whose records paid most, by the ledger's accountant with the events
    already in it; None when no client took part."""
    candidates = [schedule.event(noise_multiplier=noise_multiplier, steps=schedule.steps * r, stage=stage)
                  for schedule, r in _most_rounds_by_schedule(sizes, rounds_taken, local).items()]
    if not candidates:
        return None
    totals = [compute_epsilon([*ledger.events, e], delta=ledger.delta, accountant=ledger.accountant).epsilon
              for e in candidates]
    return candidates[int(np.argmax(totals))]
