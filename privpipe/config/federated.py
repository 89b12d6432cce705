"""federated: DP-FedAvg with client-level DP (Geyer et al. 2017; McMahan et al. 2018), used by
finetune.mode federated and by the text flow (``privpipe federated``).

Its check_use runs only where the section is used (use.py: check_federated_use).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.choices import Choice, Variant
from privpipe.config.errors import noise_or_epsilon, one_of, require
from privpipe.config.finetune import FinetuneConfig
from privpipe.config.partition import PARTITION_STRATEGIES
from privpipe.config.prepare import PrepareConfig
from privpipe.config.privacy import PrivacyConfig
from privpipe.config.ranges import (
    MAX_BATCH,
    MAX_COUNT,
    MAX_EPOCHS,
    MAX_EPSILON,
    MAX_RATE,
    MAX_SCALE,
    Range,
    above,
    at_least,
    fraction,
)

# the choices of privpipe.federated (which imports torch: checking params must not)
SAMPLINGS = ("poisson", "fixed")
#: federated.noise: who adds the noise, the server (client-level DP) or each client (record-level DP)
NOISE_MODES: Choice[Variant] = Choice("federated.noise", [
    Variant(tag="server", implementation="privpipe.federated.noise_modes:ServerNoiseMode"),
    Variant(tag="client", implementation="privpipe.federated.noise_modes:ClientNoiseMode"),
])
SERVER_OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class FederatedConfig:
    #: K: the sensitive set split into K clients (ignored when text.client_column names natural clients); server noise
    #: needs many: its noise per coordinate is z·S/(qK) (the federated tutorial: what K a target needs)
    clients: int = 500
    #: csv data: a column naming each record's client (natural clients; K = how many there are)
    client_column: str | None = None
    #: iid | dirichlet (label skew, alpha) | label_shards (labels_per_shard classes each)
    strategy: str = "iid"
    #: dirichlet: concentration of each client's label mix (smaller: more skew)
    alpha: float = 0.5
    #: label_shards: how many classes each client holds
    labels_per_shard: int = 2
    #: refuse a split leaving a client with fewer records (0: empty clients allowed; they send nothing)
    min_records: int = 1  # an empty client only sends a zero update; refuse that unless asked (0)
    #: poisson (each client joins a round with probability q; amplified) | fixed (exactly round(qK); not amplified)
    sampling: str = "poisson"  # amplified by subsampling, which fixed-size rounds are not
    #: q; the noisy sum is divided by the fixed qK (poisson) or round(qK) (fixed), never by who answered
    sample_rate: float = 1.0
    #: the most rounds; training stops earlier, and says so, before a round that would pass privacy.epsilon_budget
    rounds: int = 10
    #: E: each sampled client's passes over its own records
    local_epochs: int = 5
    #: records per local SGD step (client noise: the lot size of each client's DP-SGD)
    local_batch_size: int = 16
    #: each client's SGD learning rate
    local_learning_rate: float = 0.5
    #: FedProx proximal term μ/2·‖w − w_global‖² (0 = FedAvg)
    prox_mu: float = 0.0
    #: false: non-private FedAvg/FedProx/FedAdam (no clipping, no noise; refused for finetune)
    private: bool = True  # the pipeline only releases private models; false is for baselines
    #: who adds the noise: server (a trusted server adds it to the sum: client-level DP, K taken as public) | client
    #: (each client runs DP-SGD on its own records, lots of local_batch_size; the server only averages and never sees
    #: an unprotected update: record-level DP, the worst client's ε reported)
    noise: str = "server"  # server: client-level DP, a trusted server adds it | client: each client's DP-SGD
    #: S: server: each client's update is clipped to this L2 norm | client: each example's gradient (C)
    clip_norm: float = 1.0
    #: z: server: N(0, z²S²) on the sum | client: each client's DP-SGD σ; or null and set target_epsilon
    noise_multiplier: float | None = None
    #: find z so that the run's total ε after all rounds (earlier stages included) is at most this: record-level in the
    #: pipeline (a record changes one client: two add-or-remove steps), client-level in the text flow
    target_epsilon: float | None = 3.0  # z is calibrated so that every planned round fits, instead of guessed
    #: sgd (FedAvg, server_learning_rate 1) | adam (FedAdam, Reddi et al. 2021)
    server_optimizer: str = "sgd"  # FedAvg with server momentum 0; server_learning_rate 3 tuned on fortunes
    #: > 1: the mean of K clipped updates is short, and its noise shrinks with K (tuned on fortunes)
    server_learning_rate: float = 3.0
    #: sgd only
    server_momentum: float = 0.0
    #: adam only
    server_beta1: float = 0.9
    #: adam only
    server_beta2: float = 0.99
    #: adam's adaptivity τ
    server_epsilon: float = 0.001
    #: ε by round is logged at this many rounds
    epsilon_curve_points: int = 20

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {
        "clients": at_least(1, MAX_COUNT), "alpha": above(0, MAX_SCALE), "labels_per_shard": at_least(1, 10**6),
        "min_records": at_least(0, MAX_COUNT), "sample_rate": fraction(one=True), "rounds": at_least(1, 10**6),
        "local_epochs": at_least(1, MAX_EPOCHS), "local_batch_size": at_least(1, MAX_BATCH),
        "local_learning_rate": above(0, MAX_RATE), "prox_mu": at_least(0, MAX_SCALE),
        "clip_norm": at_least(0, MAX_SCALE), "noise_multiplier": above(0, MAX_SCALE),
        "target_epsilon": above(0, MAX_EPSILON), "server_learning_rate": above(0, MAX_RATE),
        "server_momentum": fraction(zero=True), "server_beta1": fraction(zero=True),
        "server_beta2": fraction(zero=True), "server_epsilon": above(0, 1), "epsilon_curve_points": at_least(2, 10**4),
    }


def check_client_column(federated: FederatedConfig, *, prepare: PrepareConfig) -> None:
    """A client column is a column of the pipeline's table: the natural partition (a hospital, a branch)."""
    if federated.client_column is None:
        return
    require(not prepare.images, "federated.client_column",
            f"names a column of table data; {prepare.dataset} has none (use federated.strategy)")
    for key in ("id_column", "label_column"):
        require(federated.client_column != getattr(prepare, key), "federated.client_column",
                f"is prepare.{key} too")
    require(federated.client_column not in (prepare.feature_columns or ()), "federated.client_column",
            "is listed in prepare.feature_columns: a client's name is not a feature")


def check(federated: FederatedConfig, *, finetune: FinetuneConfig, privacy: PrivacyConfig) -> None:
    require(federated.clients >= 1, "federated.clients", "must be >= 1")
    one_of(federated.strategy, PARTITION_STRATEGIES, "federated.strategy")
    require(federated.alpha > 0, "federated.alpha", "must be > 0")
    require(federated.labels_per_shard >= 1, "federated.labels_per_shard", "must be >= 1")
    require(federated.min_records >= 0, "federated.min_records", "must be >= 0 (0: clients may hold no records; "
            "they send a zero update)")
    one_of(federated.sampling, SAMPLINGS, "federated.sampling")
    require(0 < federated.sample_rate <= 1, "federated.sample_rate", "must be in (0, 1]")
    for key in ("rounds", "local_epochs", "local_batch_size"):
        require(getattr(federated, key) >= 1, f"federated.{key}", "must be >= 1")
    require(federated.local_learning_rate > 0, "federated.local_learning_rate", "must be > 0")
    require(federated.prox_mu >= 0, "federated.prox_mu", "must be >= 0 (0 = FedAvg, > 0 = FedProx)")
    one_of(federated.server_optimizer, SERVER_OPTIMIZERS, "federated.server_optimizer")
    require(federated.server_learning_rate > 0, "federated.server_learning_rate", "must be > 0")
    require(0 <= federated.server_momentum < 1, "federated.server_momentum", "must be in [0, 1)")
    for key in ("server_beta1", "server_beta2"):
        require(0 <= getattr(federated, key) < 1, f"federated.{key}", "must be in [0, 1)")
    require(federated.server_epsilon > 0, "federated.server_epsilon", "must be > 0")
    require(federated.epsilon_curve_points >= 2, "federated.epsilon_curve_points", "must be >= 2")
    NOISE_MODES.check(federated.noise)
    if federated.private and federated.noise == "client":
        require(federated.prox_mu == 0, "federated.prox_mu", "must be 0 with federated.noise: client (each client "
                "runs plain DP-SGD; FedProx's proximal term is not part of it)")
        require(federated.min_records >= 1, "federated.min_records", "must be >= 1 with federated.noise: client "
                "(a client with no records runs no DP-SGD)")
    if federated.private:
        require(federated.clip_norm > 0, "federated.clip_norm", "must be > 0 (it bounds each client's influence)")
        noise_or_epsilon("federated", federated.noise_multiplier, "target_epsilon", federated.target_epsilon)
    if finetune.mode == "federated":
        require(federated.private or not finetune.enabled, "federated.private",
                "false would deploy a model with no privacy guarantee; the pipeline only releases private models "
                "(non-private baselines: privpipe federated, or bench/federated_text.py)")
        check_use(federated, privacy=privacy, clients=federated.clients)


def check_use(federated: FederatedConfig, *, privacy: PrivacyConfig, clients: int | None) -> None:
    """What only matters where the federated section is used (finetune.mode federated, the text flow):
    a target within the budget, and δ below 1/K where K is known (``clients``; None for natural
    clients, counted when the data is read)."""
    if not federated.private:
        return
    if federated.target_epsilon is not None:
        require(federated.target_epsilon <= privacy.epsilon_budget, "federated.target_epsilon",
                f"exceeds privacy.epsilon_budget ({privacy.epsilon_budget})")
    if clients is not None:
        require(privacy.delta * clients < 1, "privacy.delta",
                f"{privacy.delta:g} is not below 1/K = {1 / clients:.3g} for K = {clients} clients: at that δ "
                "publishing one whole client's data would meet the guarantee (use δ ≪ 1/K)")
