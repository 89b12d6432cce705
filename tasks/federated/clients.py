"""One client's local training in a federated round, as a task the flow maps over the round's clients.

A :class:`ClientJob` says where the clients' data lives (``.npy`` files, one row per
record, and each record's client), which model to build and how to train locally. Tasks
pass it and the global weights; each returns its update. Every worker thread builds its
model once and reuses it (a LoRA-wrapped encoder takes seconds to build), and reads the
data through memory maps, so a client holds only its own rows.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.federated import ClientNoise, ClientUpdates, LocalConfig, local_update, private_local_update
from privpipe.models import make_network, seeded
from privpipe.text import load_encoder, make_linear_head, make_lora_classifier
from tasks.common import apply_torch_threads, seed_for

__all__ = ["ModelSpec", "ClientData", "ClientJob", "build_model", "train_client", "sequential_updates",
           "client_update_task", "client_rows", "client_sizes"]

MODEL_KINDS = ("network", "linear", "lora")


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # network (the pipeline's mlp/cnn) | linear (head on embeddings) | lora (encoder + adapters + head)
    classes: int
    in_features: int = 0
    network: str = "mlp"
    hidden_units: tuple[int, ...] = ()
    encoder: str = ""  # lora: the encoder folder
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ("query", "value")
    input_scale: float = 1.0  # linear/lora: fixed factor on the unit-norm sentence embedding
    maps: tuple[int, int, int] | None = None  # network cnn behind a ScatterNet front: its coefficient maps
    image: tuple[int, int, int] | None = None  # network cnn on pixels: (channels, height, width)


@dataclass(frozen=True)
class ClientData:
    inputs: tuple[str, ...]  # .npy files: the model's inputs, in argument order
    labels: str  # .npy of int64 labels
    assignment: str  # .npy: each record's client index in [0, clients)
    clients: int


@dataclass(frozen=True)
class ClientJob:
    model: ModelSpec
    data: ClientData
    local: LocalConfig
    seed: int  # run.seed: local shuffling follows seed_for(seed, "client", round, client)
    torch_threads: int = 1  # each update's torch threads, mapped or one after another (tasks.common.task_threads)
    device: str = "cpu"  # where each update trains (run.device, resolved by the stage)
    noise: ClientNoise | None = None  # client noise: each client trains by DP-SGD (federated.noise: client)


def build_model(spec: ModelSpec) -> torch.nn.Module:
    """A fresh model of the spec's architecture; its trainable weights are overwritten from the
    global vector before every use, so only the frozen parts' values matter here."""
    if spec.kind == "network":
        return make_network(spec.network, in_features=spec.in_features, hidden_units=spec.hidden_units,
                            classes=spec.classes, maps=spec.maps, image=spec.image)
    if spec.kind == "linear":
        return make_linear_head(spec.in_features, spec.classes, input_scale=spec.input_scale)
    if spec.kind == "lora":
        encoder, _ = load_encoder(Path(spec.encoder))
        # LoRA's A matrices start random: seeded, so every worker builds the same initial model
        return seeded(0, lambda: make_lora_classifier(encoder, classes=spec.classes, rank=spec.lora_rank,
                                                      alpha=spec.lora_alpha, targets=spec.lora_targets,
                                                      input_scale=spec.input_scale))
    raise ValueError(f"unknown model kind {spec.kind!r} (choose one of {', '.join(MODEL_KINDS)})")


_LOCAL = threading.local()
_ARRAYS: dict[str, np.ndarray] = {}
_ARRAYS_LOCK = threading.Lock()


def _thread_model(spec: ModelSpec, device: str) -> torch.nn.Module:
    models = _LOCAL.__dict__.setdefault("models", {})
    if (spec, device) not in models:
        models.clear()  # one model per thread: a new spec (a new run) replaces the old one
        models[spec, device] = build_model(spec).to(device)
    return models[spec, device]


def _array(path: str) -> np.ndarray:
    with _ARRAYS_LOCK:
        if path not in _ARRAYS:
            _ARRAYS[path] = np.load(path, mmap_mode="r")
        return _ARRAYS[path]


def forget_arrays() -> None:
    """Drop the memory maps (a new run may rewrite the files)."""
    with _ARRAYS_LOCK:
        _ARRAYS.clear()


def client_rows(data: ClientData, client: int) -> np.ndarray:
    return np.flatnonzero(_array(data.assignment) == client)


def client_sizes(data: ClientData) -> tuple[int, ...]:
    """Each client's record count (client noise: public, as DP-SGD's n; it fixes the client's lot rate)."""
    return tuple(int(c) for c in np.bincount(_array(data.assignment), minlength=data.clients))


def train_client(job: ClientJob, client: int, round_: int, weights: np.ndarray) -> np.ndarray:
    """Client ``client``'s update in round ``round_``, starting from ``weights``."""
    apply_torch_threads(job.torch_threads)  # in this worker thread or process (tasks.common)
    rows = client_rows(job.data, client)
    if not len(rows):  # a client with no records (federated.min_records: 0) has nothing to send
        return np.zeros_like(weights, dtype=np.float32)
    inputs = tuple(torch.as_tensor(np.asarray(_array(p)[rows])) for p in job.data.inputs)
    labels = torch.as_tensor(np.asarray(_array(job.data.labels)[rows]))
    tensors = (*inputs, labels)
    seed = int(seed_for(job.seed, "client", round_, client).generate_state(1)[0])
    model = _thread_model(job.model, job.device)
    if job.noise is not None:  # the update leaves the client private: the server's view is accounted per record
        # client noise clips each example through the model: one input array (frozen embeddings), refused
        # otherwise by config (text.mode: lora with federated.noise: client)
        update, _ = private_local_update(model, (inputs[0], labels), start=weights, local=job.local, noise=job.noise,
                                         seed=seed, device=job.device)
        return update
    return local_update(model, tensors, start=weights, config=job.local, seed=seed)


def sequential_updates(job: ClientJob) -> ClientUpdates:
    """Train the sampled clients one after another (``dvc repro``, benchmarks)."""
    return lambda round_, weights, sampled: [train_client(job, int(k), round_, weights) for k in sampled]


@task(name="client-update", cache_policy=NO_CACHE)
def client_update_task(job: ClientJob, client: int, round_: int, weights: np.ndarray) -> np.ndarray:
    return train_client(job, client, round_, weights)
