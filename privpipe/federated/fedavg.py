"""The DP-FedAvg round loop (Geyer et al. 2017; McMahan et al. 2018), and its non-private twin.

    result = run_fedavg(initial, config=config, client_updates=train_clients, noise=noise,
                        ledger=ledger, stage="federated")

Each round: sample clients, hand them the global weights (``client_updates`` trains them: a
plain loop, or mapped tasks on a task runner), clip and sum their updates, add noise, divide
by the fixed denominator, apply with the server optimiser (``noise="server"``: client-level DP,
a trusted server). With ``noise="client"`` the clients' updates arrive already private (each
ran DP-SGD: privpipe.federated.client_noise), the server only averages them, and the ledger
records the worst client's record-level event. Each mode is a class of
privpipe.federated.noise_modes, which ``noise`` names. Before a round the ledger is
asked what the run would cost with it; the loop stops *before* a round that would pass the
ledger's budget and says so. With ``private=False`` the same loop runs without clipping,
noise or accounting (FedAvg / FedProx / FedAdam baselines).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from privpipe.federated.accounting import SAMPLINGS, denominator
from privpipe.federated.aggregation import plain_mean
from privpipe.federated.local import LocalConfig
from privpipe.federated.noise_modes import NoiseMode, noise_mode
from privpipe.federated.sampling import ClientSampler
from privpipe.federated.server_optimizer import ServerOptimizer
from privpipe.privacy import Event, Ledger, NoiseSource, compute_epsilon

__all__ = ["FedAvgConfig", "FedAvgResult", "ClientUpdates", "run_fedavg", "epsilon_curve"]

#: (round, global weights, sampled client indices) → one update per sampled client, None if it dropped out
ClientUpdates = Callable[[int, np.ndarray, np.ndarray], Sequence[np.ndarray | None]]


@dataclass(frozen=True)
class FedAvgConfig:
    clients: int  # K
    rounds: int
    sample_rate: float  # q
    sampling: str = "poisson"  # poisson | fixed (see accounting)
    private: bool = True
    clip_norm: float = 1.0  # S
    noise_multiplier: float = 1.0  # z (private only)
    server_optimizer: str = "sgd"
    server_learning_rate: float = 1.0
    server_momentum: float = 0.0
    server_beta1: float = 0.9
    server_beta2: float = 0.99
    server_epsilon: float = 1e-3
    #: account per record, not per client: one record changes its client's update, so every
    #: server-noise event is its record-level form (privacy.group); client noise is record-level anyway
    record_level: bool = False
    noise: str = "server"  # who adds the noise: server | client (NOISE_MODES: privpipe.federated.noise_modes)
    #: client noise: each client's record count (public, as DP-SGD's n) and its local DP-SGD
    client_sizes: tuple[int, ...] = ()
    local: LocalConfig | None = None

    def __post_init__(self) -> None:
        if self.clients < 1 or self.rounds < 1:
            raise ValueError("clients and rounds must be >= 1")
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate!r}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling: unknown {self.sampling!r}")
        if self.private and not (self.clip_norm > 0 and self.noise_multiplier > 0):
            raise ValueError("private training needs clip_norm > 0 and noise_multiplier > 0")
        self.noise_mode.check(self)  # an unknown name raises here

    @property
    def noise_mode(self) -> NoiseMode:
        return noise_mode(self.noise)

    def event(self, rounds: int, *, stage: str, noise_multiplier: float | None = None) -> Event:
        """What ``rounds`` rounds cost at most: server noise, the round event (record-level if asked);
        client noise, the smallest client's DP-SGD in every round (its lots are the largest share of
        its records)."""
        z = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        return self.noise_mode.event(self, rounds, stage=stage, noise_multiplier=z)


@dataclass
class FedAvgResult:
    weights: np.ndarray
    rounds_run: int
    event: Event | None  # what the ledger recorded (None: non-private)
    stopped: str | None  # why training ended before config.rounds, if it did
    history: list[dict[str, float]] = field(default_factory=list)  # per round: clients, seconds, evaluation
    rounds_taken: np.ndarray | None = None  # per client: the rounds whose update it sent


def _over_budget(ledger: Ledger, planned: Event) -> float | None:
    """The total ε with ``planned`` if that passes the budget, else None.

    RDP first: it is cheap at any noise level and never below the ledger's reported bound
    (``best`` takes the smaller), so under budget by RDP means under budget. Only near the
    end is the ledger's own, tighter accountant asked.
    """
    events = [*ledger.events, planned]
    if compute_epsilon(events, delta=ledger.delta, accountant="rdp").epsilon <= ledger.epsilon_budget:
        return None
    total = ledger.epsilon([planned]).epsilon
    return total if total > ledger.epsilon_budget else None


def epsilon_curve(ledger: Ledger, config: FedAvgConfig, *, rounds: int, points: int,
                  stage: str) -> list[dict[str, float]]:
    """Total ε after round r (the ledger's accountant, events before training included) at up to
    ``points`` evenly spaced rounds, the last one always: what MLflow draws per round."""
    before = [e for e in ledger.events if e.stage != stage]
    marks = np.unique(np.linspace(1, rounds, min(points, rounds)).round().astype(int))
    return [{"round": int(r), "epsilon": compute_epsilon([*before, config.event(int(r), stage=stage)],
                                                         delta=ledger.delta, accountant=ledger.accountant).epsilon}
            for r in marks]


def run_fedavg(initial: np.ndarray, *, config: FedAvgConfig, client_updates: ClientUpdates, noise: NoiseSource,
               ledger: Ledger | None = None, stage: str = "federated",
               evaluate: Callable[[np.ndarray], dict[str, float]] | None = None,
               on_round: Callable[[dict[str, float]], None] | None = None) -> FedAvgResult:
    """Run up to ``config.rounds`` rounds from ``initial``; record the rounds run in ``ledger``."""
    if config.private and ledger is None:
        raise ValueError("private training needs a ledger to account for its rounds")
    charged = ledger if config.private else None  # the ledger the rounds are charged to (None: not private)
    mode = config.noise_mode
    sampler = ClientSampler(clients=config.clients, sample_rate=config.sample_rate, sampling=config.sampling,
                            noise=noise)
    server = ServerOptimizer(kind=config.server_optimizer, learning_rate=config.server_learning_rate,
                             momentum=config.server_momentum, beta1=config.server_beta1,
                             beta2=config.server_beta2, epsilon=config.server_epsilon)
    fixed_d = denominator(sampling=config.sampling, clients=config.clients, sample_rate=config.sample_rate)
    weights = np.asarray(initial, dtype=np.float64).copy()
    rounds_taken = np.zeros(config.clients, dtype=np.int64)  # client noise: each client's rounds, for its ε
    history: list[dict[str, float]] = []
    stopped, rounds_run = None, 0
    for r in range(1, config.rounds + 1):
        record: dict[str, float] = {"round": r}
        if charged is not None:
            over = _over_budget(charged, config.event(r, stage=stage))
            if over is not None:
                stopped = (f"{stage}: stopped before round {r}: it would take total ε to {over:.4g} "
                           f"(δ = {charged.delta:g}), over the budget of {charged.epsilon_budget:g}")
                break
        started = time.perf_counter()
        sampled = sampler.sample()
        updates = list(client_updates(r, weights.astype(np.float32), sampled)) if len(sampled) else []
        if len(updates) != len(sampled):
            raise RuntimeError(f"round {r}: {len(updates)} updates for {len(sampled)} sampled clients")
        received = [np.asarray(u, dtype=np.float64) for u in updates if u is not None]
        rounds_taken[[k for k, u in zip(sampled, updates) if u is not None]] += 1
        if charged is not None:
            mean = mode.mean(received, dim=len(weights), config=config, denominator=fixed_d, noise=noise)
        else:
            mean = plain_mean(received, dim=len(weights))
        weights = server.step(weights, mean)
        rounds_run = r
        record.update(clients_sampled=len(sampled), clients_dropped=len(sampled) - len(received),
                      seconds=time.perf_counter() - started)  # the round's clients and aggregation, not evaluation
        if evaluate is not None:
            record.update(evaluate(weights.astype(np.float32)))
        history.append(record)
        if on_round is not None:
            on_round(record)
    event = None
    if charged is not None:
        event = mode.recorded_event(config, rounds_run=rounds_run, rounds_taken=rounds_taken, ledger=charged,
                                    stage=stage)
        if event is not None:
            charged.record(event)
    return FedAvgResult(weights=weights.astype(np.float32), rounds_run=rounds_run, event=event, stopped=stopped,
                        history=history, rounds_taken=rounds_taken)
