"""Federated learning with client-level differential privacy (DP-FedAvg) and its non-private baselines."""

from privpipe.federated.accounting import SAMPLINGS, check_client_delta, denominator, round_event
from privpipe.federated.aggregation import clip_update, plain_mean, private_mean
from privpipe.federated.client_noise import ClientNoise, client_schedule, private_local_update, worst_client_event
from privpipe.federated.fedavg import ClientUpdates, FedAvgConfig, FedAvgResult, epsilon_curve, run_fedavg
from privpipe.federated.local import LocalConfig, load_vector, local_update, trainable_vector
from privpipe.federated.noise_modes import ClientNoiseMode, NoiseMode, ServerNoiseMode, noise_mode
from privpipe.federated.sampling import ClientSampler
from privpipe.federated.server_optimizer import SERVER_OPTIMIZERS, ServerOptimizer

__all__ = ["SAMPLINGS", "SERVER_OPTIMIZERS", "round_event", "check_client_delta", "denominator", "clip_update",
           "private_mean", "plain_mean", "ClientSampler", "ServerOptimizer", "LocalConfig", "local_update",
           "trainable_vector", "load_vector", "FedAvgConfig", "FedAvgResult", "ClientUpdates", "run_fedavg",
           "epsilon_curve", "NoiseMode", "ServerNoiseMode", "ClientNoiseMode", "noise_mode",
           "ClientNoise", "client_schedule", "private_local_update", "worst_client_event"]
