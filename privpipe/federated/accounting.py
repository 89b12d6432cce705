"""What a DP-FedAvg run costs, with one *client* as the unit of privacy.

Client-level adjacency (Geyer et al. 2017; McMahan et al. 2018): neighbouring datasets
differ by all the records of one client, added or removed, **with K, the number of clients,
public and the same on both sides** (a removed client is an empty one that sends nothing).
The fixed denominator qK and the unamplified ``fixed`` sample size round(qK) rest on that;
natural clients counted from the data must be published as such. Each round releases

    (Σ_{sampled k} clip(Δ_k, S) + N(0, z²S²·I)) / D

with a fixed denominator D. Adding or removing one client moves the noisy sum by at
most S, so a round is a Gaussian mechanism with noise multiplier z, and D being fixed
(not the number of clients that answered) keeps it so. How the round's clients were
drawn decides the accounting, and the ledger event says which:

- ``poisson``: every client joins independently with probability q, so subsampling
  amplifies: ``PoissonGaussianEvent(z, q, rounds)``, D = q·K.
- ``fixed``: exactly m = round(q·K) clients without replacement, accounted *without*
  amplification (no add-or-remove accountant in dp_accounting covers it):
  ``GaussianEvent(z, rounds)``, D = m.

A client-level bound is *not* by itself a record-level one: adding or removing a record
changes its client's data, which is two add-or-remove steps of a client. Where records are
the unit (the pipeline's ledger, the lifetime budget) these events are taken in their
group-of-two form (privpipe.privacy.group).
"""

from __future__ import annotations

from privpipe.config.federated import SAMPLINGS
from privpipe.privacy import Event, GaussianEvent, PoissonGaussianEvent

__all__ = ["SAMPLINGS", "round_event", "check_client_delta", "denominator"]

#: McMahan et al. 2018 take δ = K^-1.1: comfortably below the 1/K at which a mechanism could
#: publish one whole client's data and still meet the definition
DELTA_EXPONENT = 1.1


def round_event(*, sampling: str, noise_multiplier: float, sample_rate: float, rounds: int,
                stage: str) -> Event:
    """The ledger event of ``rounds`` rounds of DP-FedAvg."""
    if sampling == "poisson":
        return PoissonGaussianEvent(stage=stage, noise_multiplier=noise_multiplier, sample_rate=sample_rate,
                                    steps=rounds)
    if sampling == "fixed":
        return GaussianEvent(stage=stage, noise_multiplier=noise_multiplier, count=rounds)
    raise ValueError(f"sampling: unknown {sampling!r} (choose one of {', '.join(SAMPLINGS)})")


def fixed_count(*, clients: int, sample_rate: float) -> int:
    """Clients per round under ``fixed`` sampling: round(q·K), at least one."""
    return max(1, round(sample_rate * clients))


def denominator(*, sampling: str, clients: int, sample_rate: float) -> float:
    """The fixed D the noisy sum is divided by: the expected (poisson) or exact (fixed) clients per round."""
    return sample_rate * clients if sampling == "poisson" else float(fixed_count(clients=clients,
                                                                              sample_rate=sample_rate))


def check_client_delta(*, delta: float, clients: int) -> str | None:
    """Refuse δ ≥ 1/K; return a warning (else None) when δ is above McMahan et al.'s K^-1.1.

    With δ ≥ 1/K a mechanism that publishes one random client's data whole is (0, δ)-DP, so
    such a δ promises nothing at the client level.
    """
    if delta * clients >= 1:
        raise ValueError(f"privacy.delta: {delta:g} is not below 1/K = {1 / clients:.3g} for K = {clients} clients; "
                         "at that δ publishing one whole client's data would meet the guarantee (use δ ≪ 1/K)")
    if delta > clients ** -DELTA_EXPONENT:
        return (f"privacy.delta = {delta:g} is below 1/K but above K^-1.1 = {clients ** -DELTA_EXPONENT:.3g} "
                f"(K = {clients}), the δ McMahan et al. 2018 use; consider a smaller δ")
    return None
