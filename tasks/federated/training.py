"""DP-FedAvg wired to params.yaml: the clients, σ, the noise source, the round loop, the ε curve.

Shared by the pipeline's finetune stage (``finetune.mode: federated``) and the federated
text flow. ``updates_for(job)`` gives the client updates: mapped Prefect tasks in a flow
(flows.client_map), a plain loop otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import numpy as np

from privpipe.config import ConfigError, Params
from privpipe.data.partition import assign_shards
from privpipe.federated import (
    ClientNoise,
    ClientUpdates,
    FedAvgConfig,
    FedAvgResult,
    LocalConfig,
    check_client_delta,
    epsilon_curve,
    noise_mode,
    run_fedavg,
)
from privpipe.privacy import Event, Ledger, NoiseSource
from tasks.common import seed_for
from tasks.federated.clients import ClientJob, client_sizes, sequential_updates
from tasks.privacy import uncovered
from tasks.privacy.ledger import calibrate_for
from tasks.progress import progress

__all__ = ["assign_clients", "fedavg_config", "train_federated", "FederatedRun"]


def assign_clients(params: Params, *, ids: np.ndarray, labels: np.ndarray, classes: int,
                   natural: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Each record's client and the client count K.

    Natural clients (a client column) are numbered in sorted order and K is their number,
    taken as public (the population size a service would publish). Otherwise the sensitive
    set is split into ``federated.clients`` shards by ``federated.strategy``, with the keyed
    per-record assignment of the partition stage (one record never moves another).
    """
    if natural is not None:
        names, assignment = np.unique(natural, return_inverse=True)
        return assignment.astype(np.int64), len(names)
    fed = params.federated
    try:
        assignment = assign_shards(ids, labels, shards=fed.clients, strategy=fed.strategy, seed=params.run.seed,
                                   alpha=fed.alpha, labels_per_shard=fed.labels_per_shard,
                                   min_records=fed.min_records, classes=classes)
    except ValueError as exc:
        key, problem = str(exc).split(":", 1)
        raise ConfigError(f"federated.{'clients' if key == 'shards' else key}: {problem.strip()}") from None
    return assignment, fed.clients


def fedavg_config(params: Params, *, clients: int, record_level: bool, local: LocalConfig | None = None,
                  sizes: tuple[int, ...] = ()) -> FedAvgConfig:
    fed = params.federated
    return FedAvgConfig(clients=clients, noise=fed.noise if fed.private else "server", client_sizes=sizes, local=local,
                        rounds=fed.rounds, sample_rate=fed.sample_rate, sampling=fed.sampling,
                        private=fed.private, clip_norm=fed.clip_norm, record_level=record_level,
                        noise_multiplier=fed.noise_multiplier if fed.noise_multiplier is not None else 1.0,
                        server_optimizer=fed.server_optimizer, server_learning_rate=fed.server_learning_rate,
                        server_momentum=fed.server_momentum, server_beta1=fed.server_beta1,
                        server_beta2=fed.server_beta2, server_epsilon=fed.server_epsilon)


@dataclasses.dataclass
class FederatedRun:
    result: FedAvgResult
    config: FedAvgConfig
    curve: list[dict[str, float]]  # total ε after round r (private runs)


def train_federated(params: Params, job: ClientJob, *, initial: np.ndarray, ledger: Ledger, stage: str,
                    record_level: bool, log: logging.Logger | logging.LoggerAdapter,
                    updates_for: Callable[[ClientJob], ClientUpdates] = sequential_updates,
                    evaluate: Callable[[np.ndarray], dict[str, float]] | None = None,
                    before_rounds: Callable[[Event], None] | None = None) -> FederatedRun:
    """Check δ against K, fix σ (given, or calibrated so the run's total after all rounds is at most
    ``federated.target_epsilon``), run the rounds and record them in ``ledger``.

    ``record_level``: the ledger composes record-level events (the pipeline), so each round is
    accounted in its group-of-two form; else client-level (the text flow's own ledger).
    ``before_rounds(event)`` sees the most the rounds can cost, once σ is fixed (private runs);
    it may refuse the run by raising."""
    fed = params.federated
    client_noise = fed.private and noise_mode(fed.noise).clients_run_dpsgd
    config = fedavg_config(params, clients=job.data.clients, record_level=record_level, local=job.local,
                           sizes=client_sizes(job.data) if client_noise else ())
    if client_noise and min(config.client_sizes) < 1:
        raise ConfigError("federated.noise: client needs every client to hold records (a client with none runs no "
                          "DP-SGD); set federated.min_records >= 1")
    if fed.private:
        try:  # client-level δ: the server-noise guarantee (client noise protects records, a smaller unit)
            warning = None if client_noise else check_client_delta(delta=ledger.delta, clients=config.clients)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if warning:
            log.warning("%s: %s", stage, warning)
        if fed.noise_multiplier is None:
            sigma = calibrate_for(ledger, lambda noise_multiplier: config.event(fed.rounds, stage=stage,
                                                                               noise_multiplier=noise_multiplier),
                                  target_epsilon=fed.target_epsilon, key="federated.target_epsilon")
            config = dataclasses.replace(config, noise_multiplier=sigma)
            log.info("%s: z = %.4g reaches total ε ≤ %g after %d rounds", stage, sigma, fed.target_epsilon,
                     fed.rounds)
        if client_noise:
            job = dataclasses.replace(job, noise=ClientNoise(noise_multiplier=config.noise_multiplier,
                                                             clip_norm=config.clip_norm,
                                                             secure_rng=params.privacy.secure_rng))
            log.info("%s: client noise: K = %d clients, each runs DP-SGD (lots of %d, clip C = %g, σ = %.4g) on its "
                     "own %d–%d records; record-level ε per client over its rounds, the worst reported; record "
                     "counts per client taken as public", stage, config.clients, job.local.batch_size,
                     config.clip_norm, config.noise_multiplier, min(config.client_sizes), max(config.client_sizes))
        else:
            log.info("%s: K = %d clients (taken as public), %s sampling at q = %g, clip S = %g, noise z = %.4g; %s",
                     stage, config.clients, config.sampling, config.sample_rate, config.clip_norm,
                     config.noise_multiplier, "amplified by subsampling" if config.sampling == "poisson"
                     else "accounted without amplification")
        if before_rounds is not None:
            before_rounds(config.event(config.rounds, stage=stage))
    else:
        log.warning("%s: federated.private is false: no clipping, no noise, no privacy guarantee", stage)
    noise = NoiseSource(seed=seed_for(params.run.seed, "federated"), secure=params.privacy.secure_rng)

    def report(record: dict[str, float]) -> None:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in record.items() if k.startswith("accuracy"))
        dropped = f" ({record['clients_dropped']} dropped)" if uncovered.recorded(params) else ""
        log.info("%s: round %d/%d, %d clients%s%s", stage, record["round"], config.rounds,
                 record["clients_sampled"], dropped, f", {shown}" if shown else "")
        bar.update()

    with progress(config.rounds, f"{stage} (federated rounds)") as bar:
        result = run_fedavg(initial, config=config, client_updates=updates_for(job),
                            noise=noise, ledger=ledger if fed.private else None, stage=stage, evaluate=evaluate,
                            on_round=report)
    if result.stopped:
        log.warning(result.stopped)
    curve = (epsilon_curve(ledger, config, rounds=result.rounds_run, points=fed.epsilon_curve_points, stage=stage)
             if fed.private and result.rounds_run else [])
    return FederatedRun(result=result, config=config, curve=curve)
