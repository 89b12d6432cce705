"""Who adds DP-FedAvg's noise: one class per mode behind one interface, chosen by name (``federated.noise``).

    mode = noise_mode("client")
    mode.clients_run_dpsgd                  # True: each client's DP-SGD; the server only averages
    event = mode.event(config, 10, stage="federated", noise_multiplier=1.1)   # what 10 rounds cost at most

- ``server`` (:class:`ServerNoiseMode`): the server clips every update and adds N(0, z²S²) to their
  sum: client-level DP, with a trusted server (privpipe.federated.accounting).
- ``client`` (:class:`ClientNoiseMode`): each sampled client runs DP-SGD on its own records, so
  what it sends is already private and the server only averages: record-level DP, the worst
  client's rounds charged (privpipe.federated.client_noise).

A mode says what a private run's rounds cost (planned, and recorded after the run), how the
server combines a round's updates, whether clients run DP-SGD, and whether its guarantee is per
client or per record. A non-private run (``private=False``) has no mode to speak of: plain
mean, nothing recorded. Adding a mode: its class here and its line in privpipe/config/federated.py's
NOISE_MODES (which names the class, so that checking params does not import this package and torch).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from privpipe.config.federated import NOISE_MODES
from privpipe.federated.accounting import round_event
from privpipe.federated.aggregation import plain_mean, private_mean
from privpipe.federated.client_noise import client_schedule, worst_client_event
from privpipe.federated.local import LocalConfig
from privpipe.privacy import Event, Ledger, NoiseSource, record_level_event, record_level_ledger

__all__ = ["FedAvgSettings", "NoiseMode", "ServerNoiseMode", "ClientNoiseMode", "noise_mode"]


class FedAvgSettings(Protocol):
    """What a mode reads of a run's settings: privpipe.federated.FedAvgConfig (named by its fields here, since
    fedavg imports this module)."""

    @property
    def clients(self) -> int: ...
    @property
    def sampling(self) -> str: ...
    @property
    def sample_rate(self) -> float: ...
    @property
    def clip_norm(self) -> float: ...
    @property
    def noise_multiplier(self) -> float: ...
    @property
    def record_level(self) -> bool: ...
    @property
    def client_sizes(self) -> tuple[int, ...]: ...
    @property
    def local(self) -> LocalConfig | None: ...


@dataclass(frozen=True)
class NoiseMode(ABC):
    """The interface: what a private run's rounds cost and how a round's updates are combined."""

    #: each sampled client trains by DP-SGD, so its update leaves it private (else the server adds the noise)
    clients_run_dpsgd: ClassVar[bool] = False
    #: its events bound all of one client's records (client-level DP), not one record
    client_level: ClassVar[bool] = True

    @abstractmethod
    def check(self, config: FedAvgSettings) -> None:
        """Refuse a config this mode cannot run (ValueError)."""

    @abstractmethod
    def event(self, config: FedAvgSettings, rounds: int, *, stage: str, noise_multiplier: float) -> Event:
        """The most ``rounds`` rounds at ``noise_multiplier`` can cost: what the budget and calibration check."""

    @abstractmethod
    def mean(self, received: Sequence[np.ndarray], *, dim: int, config: FedAvgSettings, denominator: float,
             noise: NoiseSource) -> np.ndarray:
        """A private round's aggregate of the updates that arrived."""

    @abstractmethod
    def recorded_event(self, config: FedAvgSettings, *, rounds_run: int, rounds_taken: np.ndarray, ledger: Ledger,
                       stage: str) -> Event | None:
        """What the ledger records for the rounds run (``rounds_taken``: per client, the rounds it sent an update
        in); None when nothing was spent."""

    def record_level_ledger(self, ledger: Ledger) -> Ledger:
        """A ledger of this mode's events with one record as the unit: client-level events in their
        group-of-two form (one record changes its client: privpipe.privacy.group), record-level ones as
        they are. Larger ε than the client-level one, never smaller."""
        return record_level_ledger(ledger) if self.client_level else ledger


@dataclass(frozen=True)
class ServerNoiseMode(NoiseMode):
    """Server noise: the clipped updates' sum plus N(0, z²S²·I), over a fixed denominator D.

    One round is a Gaussian mechanism with noise multiplier z on one client (Poisson-sampled:
    amplified; fixed-size: not), the round event of privpipe.federated.accounting, in its
    record-level form when ``config.record_level`` (the pipeline's ledger).
    """

    clients_run_dpsgd: ClassVar[bool] = False
    client_level: ClassVar[bool] = True

    def check(self, config: FedAvgSettings) -> None:
        pass  # FedAvgConfig's own checks (clip norm and noise multiplier > 0) are all it needs

    def event(self, config: FedAvgSettings, rounds: int, *, stage: str, noise_multiplier: float) -> Event:
        event = round_event(sampling=config.sampling, sample_rate=config.sample_rate, rounds=rounds, stage=stage,
                            noise_multiplier=noise_multiplier)
        return record_level_event(event) if config.record_level else event

    def mean(self, received: Sequence[np.ndarray], *, dim: int, config: FedAvgSettings, denominator: float,
             noise: NoiseSource) -> np.ndarray:
        return private_mean(received, dim=dim, clip_norm=config.clip_norm, noise_multiplier=config.noise_multiplier,
                            denominator=denominator, noise=noise)

    def recorded_event(self, config: FedAvgSettings, *, rounds_run: int, rounds_taken: np.ndarray, ledger: Ledger,
                       stage: str) -> Event | None:
        # every round run is charged, whoever took part in it
        return self.event(config, rounds_run, stage=stage, noise_multiplier=config.noise_multiplier) if rounds_run \
            else None


def _local(config: FedAvgSettings) -> LocalConfig:
    if config.local is None:
        raise ValueError("client noise needs the clients' local training (FedAvgConfig.local)")
    return config.local


@dataclass(frozen=True)
class ClientNoiseMode(NoiseMode):
    """Client noise: each client's DP-SGD on its own records (σ = z, clip C = S); the server only averages.

    The unit is one record, which lives in one client: its cost is its own client's rounds. The
    plan charges the smallest client in every round (its lots are the largest share of its
    records); the run records the client whose records paid most, by the ledger's accountant.
    ``config.record_level`` changes nothing: these events are record-level already.
    """

    clients_run_dpsgd: ClassVar[bool] = True
    client_level: ClassVar[bool] = False

    def check(self, config: FedAvgSettings) -> None:
        if len(config.client_sizes) != config.clients or config.local is None or min(config.client_sizes,
                                                                                      default=0) < 1:
            raise ValueError("client noise needs every client's record count (each >= 1) and the local training")

    def event(self, config: FedAvgSettings, rounds: int, *, stage: str, noise_multiplier: float) -> Event:
        schedule = client_schedule(min(config.client_sizes), _local(config))
        return schedule.event(noise_multiplier=noise_multiplier, steps=schedule.steps * rounds, stage=stage)

    def mean(self, received: Sequence[np.ndarray], *, dim: int, config: FedAvgSettings, denominator: float,
             noise: NoiseSource) -> np.ndarray:
        return plain_mean(received, dim=dim)  # the updates arrive private: nothing to clip or add

    def recorded_event(self, config: FedAvgSettings, *, rounds_run: int, rounds_taken: np.ndarray, ledger: Ledger,
                       stage: str) -> Event | None:
        return worst_client_event(sizes=config.client_sizes, rounds_taken=rounds_taken, local=_local(config),
                                  noise_multiplier=config.noise_multiplier, ledger=ledger, stage=stage)


@functools.cache  # stateless: one object per name (FedAvgConfig.event asks at every σ searched)
def noise_mode(name: str) -> NoiseMode:
    """The mode registered as ``name``."""
    if name not in NOISE_MODES:
        raise ValueError(f"noise: unknown {name!r} (choose one of {', '.join(NOISE_MODES.tags)})")
    mode: NoiseMode = NOISE_MODES.load(name)()
    return mode
