"""finetune, ``mode: federated``: DP-FedAvg with client-level DP on the sensitive set's clients.

The sensitive records are split into ``federated.clients`` clients (``federated.strategy``,
the partition stage's keyed assignment), or each value of a table's ``federated.client_column``
is one client; the deployed network (from the student when
PATE ran, else fresh) is trained by federated rounds on the projected features. The run's
ledger is record-level, and one record changes its client's update (two add-or-remove
steps of a client), so the rounds join it in their group-of-two form (privacy.group), which
composes with the other stages'. Output is the same as DP-SGD's (artifacts/finetune/),
with the per-round history in place of the per-epoch one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from privpipe.config import Params
from privpipe.data import Records
from privpipe.federated import ClientUpdates, LocalConfig, load_vector, trainable_vector
from privpipe.files import private_folder
from privpipe.models import apply_front, network_maps, released_model, save_released
from privpipe.privacy import BudgetExceeded
from tasks.common import save_private_array, stage_logger, staged_dir, task_threads, write_json, write_text
from tasks.device import training_device
from tasks.federated.clients import ClientData, ClientJob, ModelSpec, forget_arrays, sequential_updates
from tasks.federated.training import assign_clients, train_federated
from tasks.finetune.deployed import FederatedModel
from tasks.finetune.start import finetune_start
from tasks.identity import MadeFrom
from tasks.paths import DatasetPaths

__all__ = ["run_finetune_federated"]


def run_finetune_federated(params: Params, *, where: DatasetPaths, start: Path, made_from: MadeFrom,
                           updates_for: Callable[[ClientJob], ClientUpdates] = sequential_updates
                           ) -> FederatedModel:
    sensitive, test, dp_pca_dir, out = where.sensitive, where.test, where.dp_pca, where.finetune
    log = stage_logger("finetune")
    cfg = params.finetune
    begin = finetune_start(params, sensitive=sensitive, dp_pca_dir=dp_pca_dir, start=start)
    ledger, records = begin.ledger, begin.records
    # federated.client_column: each value of the column is one client (the natural partition: a hospital, a
    # branch), K their number, taken as public; else the keyed shards of federated.strategy
    assignment, clients = assign_clients(params, ids=records.ids, labels=records.labels, classes=begin.classes,
                                         natural=records.clients if params.federated.client_column else None)

    # the clients' data as files the client tasks map (scratch: removed when the stage ends)
    work = out.with_name(f".{out.name}.clients")
    private_folder(work)  # the records' features: their owner's alone
    save_private_array(work / "features.npy", begin.features)
    save_private_array(work / "labels.npy", records.labels)
    save_private_array(work / "assignment.npy", assignment)
    forget_arrays()
    spec = ModelSpec(kind="network", network=cfg.model, in_features=int(np.prod(begin.features.shape[1:])),
                     hidden_units=tuple(cfg.hidden_units), classes=begin.classes,
                     maps=network_maps(cfg.model, begin.transform), image=begin.spec.image)
    fed = params.federated
    job = ClientJob(model=spec, data=ClientData(inputs=(str(work / "features.npy"),), labels=str(work / "labels.npy"),
                                                assignment=str(work / "assignment.npy"), clients=clients),
                    local=LocalConfig(epochs=fed.local_epochs, batch_size=fed.local_batch_size,
                                      learning_rate=fed.local_learning_rate, prox_mu=fed.prox_mu),
                    seed=params.run.seed, torch_threads=task_threads(params), device=str(training_device(params)))
    network = begin.network(params, start=start, dp_pca_dir=dp_pca_dir, log=log)
    test_records = Records.load(test)
    test_features = torch.as_tensor(apply_front(begin.front, test_records.features))

    def evaluate(weights: np.ndarray) -> dict[str, float]:
        load_vector(network, weights)
        with torch.no_grad():
            predicted = network(test_features).argmax(1).numpy()
        return {"accuracy_test": float((predicted == test_records.labels).mean())}

    try:
        # the run's ledger is record-level: each round is charged in its group-of-two form
        run = train_federated(params, job, initial=trainable_vector(network), ledger=ledger, stage="finetune",
                              record_level=True, log=log, updates_for=updates_for, evaluate=evaluate)
    finally:
        forget_arrays()
        for file in work.iterdir():
            file.unlink()
        work.rmdir()
    if not run.result.rounds_run:
        raise BudgetExceeded(f"{run.result.stopped}; no round fits, nothing was trained")
    load_vector(network, run.result.weights)
    model = released_model(network, list(begin.front))
    curve = [{"step": c["round"], "epsilon": c["epsilon"]} for c in run.curve]
    with staged_dir(out, made_from=made_from) as staging:
        save_released(model, staging, spec=begin.spec, mode="federated")
        write_json(staging / "history.json", {"mode": "federated", "rounds": run.result.history,
                                              "epsilon_by_round": run.curve, "epsilon_by_step": curve,
                                              "stopped": run.result.stopped})
        write_text(staging / "ledger.json", ledger.to_json())
    spend = ledger.stage_epsilon("finetune")
    history = run.result.history
    deployed = FederatedModel(
        model_dir=out, clients=run.config.clients, rounds=run.result.rounds_run, rounds_planned=run.config.rounds,
        sample_rate=run.config.sample_rate, sampling=run.config.sampling,
        clients_sampled_total=int(sum(h["clients_sampled"] for h in history)),
        clients_dropped_total=int(sum(h["clients_dropped"] for h in history)),
        noise_multiplier=run.config.noise_multiplier, clip_norm=run.config.clip_norm, epsilon=spend.epsilon,
        accuracy_test_last_round=history[-1]["accuracy_test"], stopped=run.result.stopped)
    write_json(where.metrics_file("finetune"), deployed.metrics(params))
    log.info("finetune: federated done, %d rounds, stage %s (record-level); run total %s", run.result.rounds_run,
             spend, ledger.epsilon())
    return deployed
