"""federated (text): DP-FedAvg of the text classifier over the clients, then its test accuracy.

Runs the rounds (the flow passes mapped Prefect tasks as ``updates_for``; the default is
a plain loop), evaluates the global model on the test set after every round, and writes
artifacts/federated/{weights.npy, spec.json, history.json, ledger.json}. The saved model is
the trainable vector plus the spec that rebuilds its architecture (the head alone, or the
LoRA adapters and head over the named encoder).

With server noise (``federated.noise: server``) the run's ledger is client-level (what DP-FedAvg
promises and its budget binds); its record-level form (privpipe.privacy.group: one record
moves one client's update) is reported beside it. With client noise the ledger is record-level
already: the worst client's DP-SGD over the rounds it took part in. The membership audit checks
the record-level figure and the lifetime ledger is charged it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privpipe.config import Params
from privpipe.federated import ClientUpdates, LocalConfig, load_vector, noise_mode, trainable_vector
from privpipe.privacy import Event, Ledger, Spend
from privpipe.text import check_lora_targets
from tasks import paths
from tasks.common import read_json, stage_logger, staged_dir, task_threads, use_torch_threads, write_json, write_text
from tasks.device import training_device
from tasks.federated.clients import ClientData, ClientJob, ModelSpec, build_model, forget_arrays, sequential_updates
from tasks.federated.training import train_federated
from tasks.privacy.ledger import prepared_events
from tasks.privacy.membership_audit import audit_figures, audit_released_model
from tasks.text.features import input_names
from tasks.text.model import predict_batches
from tasks.text.trained import FederatedTextModel, PrivateSpend

__all__ = ["run_federated_text", "client_job", "record_ledger", "start_from_class_names", "text_audit"]

STAGE = "federated"


def client_job(params: Params, *, text_dir: Path, features_dir: Path) -> ClientJob:
    meta = read_json(Path(text_dir) / "meta.json")
    features = read_json(Path(features_dir) / "meta.json")
    names = input_names(params.text.mode)
    if params.text.mode == "frozen":
        spec = ModelSpec(kind="linear", classes=len(meta["classes"]), in_features=features["hidden_size"],
                         input_scale=params.text.input_scale)
    else:
        spec = ModelSpec(kind="lora", classes=len(meta["classes"]), encoder=features["encoder"],
                         lora_rank=params.text.lora_rank, lora_alpha=params.text.lora_alpha,
                         # the layers actually adapted, recorded in spec.json (auto resolves by architecture)
                         lora_targets=check_lora_targets(Path(features["encoder"]), params.text.lora_targets),
                         input_scale=params.text.input_scale)
    fed = params.federated
    data = ClientData(inputs=tuple(str(Path(features_dir) / f"train_{n}.npy") for n in names),
                      labels=str(Path(features_dir) / "train_labels.npy"),
                      assignment=str(Path(text_dir) / "assignment.npy"), clients=int(meta["clients"]))
    local = LocalConfig(epochs=fed.local_epochs, batch_size=fed.local_batch_size,
                        learning_rate=fed.local_learning_rate, prox_mu=fed.prox_mu)
    return ClientJob(model=spec, data=data, local=local, seed=params.run.seed, torch_threads=task_threads(params),
                     device=str(training_device(params)))


def start_from_class_names(model: torch.nn.Module, class_embeddings: np.ndarray) -> None:
    """Zero-shot start: class c's weight row is the unit embedding of its name, so the first global
    model scores input_scale·cos(text, name). The names are public (the label set), so it is free."""
    container: Any = getattr(model, "head", model)  # linear: Sequential(scale, linear); lora: .head is that Sequential
    head = container[-1]
    with torch.no_grad():
        head.weight.copy_(torch.as_tensor(class_embeddings, dtype=head.weight.dtype))


def record_ledger(params: Params, ledger: Ledger) -> Ledger:
    """The run's ledger with one record as the unit: client noise's already is; server noise's
    client-level events take their record-level form."""
    return noise_mode(params.federated.noise).record_level_ledger(ledger)


def text_audit(params: Params, model: torch.nn.Module, weights: np.ndarray, record: Spend | None, *,
               features_dir: Path, test: tuple[tuple[np.ndarray, ...], np.ndarray]) -> dict[str, Any]:
    """The membership audit of the final global model, against the record-level claim; {} when off."""
    if not params.privacy_audit.enabled:
        return {}
    load_vector(model, weights)
    names = input_names(params.text.mode)
    train = (tuple(np.load(features_dir / f"train_{n}.npy", mmap_mode="r") for n in names),
             np.load(features_dir / "train_labels.npy"))
    # not private: nothing to contradict, AUCs only
    claimed, delta = (record.epsilon, record.delta) if record is not None else (math.inf, params.privacy.delta)
    result = audit_released_model(params, model, sensitive=train, test=test, stage=STAGE, claimed_epsilon=claimed,
                                  delta=delta,
                                  # a text file's split may be fixed (its split column): a heuristic bound
                                  exchangeable=False,
                                  # LoRA: a fresh start would also wipe the pretrained encoder
                                  calibrate=params.text.mode == "frozen")
    return audit_figures(result, claimed_epsilon=claimed)


def run_federated_text(params: Params, *, text_dir: Path | None = None, features_dir: Path | None = None,
                       out: Path | None = None,
                       updates_for: Callable[[ClientJob], ClientUpdates] = sequential_updates,
                       before_rounds: Callable[[Event], None] | None = None) -> FederatedTextModel:
    """``before_rounds(event)``: the most the rounds can cost (client-level), once σ is fixed;
    the flow's lifetime check, which may refuse the run. The folders default to the text corpus's own
    (tasks.paths.TextPaths)."""
    where = paths.for_text(params)
    text_dir, features_dir = text_dir or where.text, features_dir or where.features
    out = out or where.federated
    log = stage_logger(STAGE)
    use_torch_threads(params, STAGE)
    forget_arrays()  # files of an earlier run in this process may have been rewritten
    job = client_job(params, text_dir=text_dir, features_dir=features_dir)
    ledger = Ledger(epsilon_budget=params.privacy.epsilon_budget, delta=params.privacy.delta,
                    accountant=params.privacy.accountant,
                    events=prepared_events(text_dir))  # the label set's discovery, if prepare made one
    model = build_model(job.model)  # the server's copy: initial weights and evaluation
    if params.text.head_init == "class_names":
        start_from_class_names(model, np.load(Path(features_dir) / "class_embeddings.npy"))
    meta = read_json(Path(text_dir) / "meta.json")
    if meta.get("natural_clients"):
        log.info("federated: K = %d natural clients (text.client_column), taken as public: the guarantee's "
                 "neighbouring datasets keep K fixed (docs/tutorials/federated.md: trust models)", meta["clients"])
    test_inputs = tuple(np.load(Path(features_dir) / f"test_{n}.npy") for n in input_names(params.text.mode))
    test_labels = np.load(Path(features_dir) / "test_labels.npy")

    def evaluate(weights: np.ndarray) -> dict[str, float]:
        load_vector(model, weights)
        return {"accuracy_test": float((predict_batches(model, test_inputs) == test_labels).mean())}

    run = train_federated(params, job, initial=trainable_vector(model), ledger=ledger, stage=STAGE,
                          record_level=False, log=log, updates_for=updates_for, evaluate=evaluate,
                          before_rounds=before_rounds)
    record = record_ledger(params, ledger).epsilon() if params.federated.private else None
    features = read_json(Path(features_dir) / "meta.json")
    spec = {"model": dataclasses.asdict(job.model), "classes": meta["classes"], "mode": params.text.mode,
            "max_length": params.text.max_length, "embed_batch_size": params.text.embed_batch_size,
            "encoder_digest": features["encoder_digest"],
            "data_version": meta["data_version"], "private": params.federated.private}
    final = run.result.history[-1] if run.result.history else evaluate(run.result.weights)
    audit = text_audit(params, model, run.result.weights, record, features_dir=Path(features_dir),
                           test=(test_inputs, test_labels))
    with staged_dir(out) as staging:
        np.save(staging / "weights.npy", run.result.weights)
        write_json(staging / "spec.json", spec)
        write_json(staging / "history.json", {"rounds": run.result.history, "epsilon_by_round": run.curve,
                                              "stopped": run.result.stopped})
        write_text(staging / "ledger.json", ledger.to_json())
    spend = ledger.epsilon() if params.federated.private else None
    private = None
    if spend is not None and record is not None:
        private = PrivateSpend(noise=params.federated.noise, noise_multiplier=run.config.noise_multiplier,
                               clip_norm=run.config.clip_norm, epsilon=spend.epsilon, delta=spend.delta,
                               accountant=spend.accountant, record_epsilon=record.epsilon,
                               record_accountant=record.accountant)
        if noise_mode(params.federated.noise).clients_run_dpsgd:
            log.info("federated: test accuracy %.4f after %d rounds; %s for one record of the worst client "
                     "(its own DP-SGD over the rounds it took part in)", final["accuracy_test"],
                     run.result.rounds_run, record)
        else:
            log.info("federated: test accuracy %.4f after %d rounds; %s (client-level), %s for one record",
                     final["accuracy_test"], run.result.rounds_run, spend, record)
    else:
        log.info("federated: test accuracy %.4f after %d rounds (not private)", final["accuracy_test"],
                 run.result.rounds_run)
    history = run.result.history
    return FederatedTextModel(
        dir=out, clients=run.config.clients, rounds=run.result.rounds_run, rounds_planned=run.config.rounds,
        sample_rate=run.config.sample_rate, sampling=run.config.sampling,
        clients_sampled_total=int(sum(h["clients_sampled"] for h in history)),
        clients_dropped_total=int(sum(h["clients_dropped"] for h in history)),
        accuracy_test=final["accuracy_test"], privacy_audit=audit, private=private, stopped=run.result.stopped)
