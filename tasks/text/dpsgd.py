"""DP-SGD (text, ``text.training: dpsgd``): the text classifier trained centrally, for texts held in one place.

The pipeline's DP-SGD engine (privpipe.dpsgd: Poisson lots, per-example clipping, Gaussian noise; the finetune
section's knobs: lot_size, epochs, learning_rate, max_grad_norm, noise_multiplier or target_epsilon) trains the
linear head on the frozen encoder's cached embeddings (``text.mode: frozen``), from the class names' embeddings
like the federated head (``text.head_init``). The ledger is record-level from the start: one text is one
record. Output: artifacts/federated/ in the federated model's format (weights.npy, spec.json, history.json,
ledger.json), so the served model and the registry treat both the same.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from privpipe.config import Params
from privpipe.dpsgd import DpSgdSettings, dpsgd_schedule, train_dpsgd
from privpipe.federated import trainable_vector
from privpipe.privacy import Event, Ledger, epsilon_curve
from tasks import paths
from tasks.common import stage_logger, staged_dir, use_torch_threads, warn_insecure_rng, write_json, write_text
from tasks.device import training_device
from tasks.federated.clients import ModelSpec, build_model
from tasks.privacy.ledger import calibrate_for, prepared_events
from tasks.text.encoded import EncodedTexts
from tasks.text.model import predict_batches
from tasks.text.prepared import PreparedTexts
from tasks.text.train import start_from_class_names, text_audit
from tasks.text.trained import DpSgdTextModel

__all__ = ["run_text_dpsgd"]

STAGE = "dpsgd"


def run_text_dpsgd(params: Params, *, text_dir: Path | None = None, features_dir: Path | None = None,
                   out: Path | None = None,
                   before_training: Callable[[Event], None] | None = None) -> DpSgdTextModel:
    """``before_training(event)``: the most the steps can cost, once σ is fixed (the flow's lifetime check,
    which may refuse the run). The folders default to the text corpus's own (tasks.paths.TextPaths)."""
    where = paths.for_text(params)
    text_dir, features_dir = text_dir or where.text, features_dir or where.features
    out = out or where.federated
    log = stage_logger(STAGE)
    use_torch_threads(params, STAGE)
    cfg = params.finetune
    prepared, encoded = PreparedTexts.read(text_dir), EncodedTexts.read(features_dir)
    spec = ModelSpec(kind="linear", classes=len(prepared.classes), in_features=encoded.hidden_size,
                     input_scale=params.text.input_scale)
    model = build_model(spec)
    if params.text.head_init == "class_names":
        start_from_class_names(model, np.load(Path(features_dir) / "class_embeddings.npy"))
    train_x = np.load(Path(features_dir) / "train_embeddings.npy")
    train_y = np.load(Path(features_dir) / "train_labels.npy")
    ledger = Ledger(epsilon_budget=params.privacy.epsilon_budget, delta=params.privacy.delta,
                    accountant=params.privacy.accountant,
                    events=prepared_events(text_dir))  # the label set's discovery, if prepare made one
    schedule = dpsgd_schedule(n=len(train_y), lot_size=min(cfg.lot_size, len(train_y)), epochs=cfg.epochs)
    sigma = cfg.noise_multiplier

    def planned_event(*, noise_multiplier: float, steps: int | None = None) -> Event:
        return schedule.event(noise_multiplier=noise_multiplier, steps=steps, stage=STAGE)

    if sigma is None:
        sigma = calibrate_for(ledger, planned_event, target_epsilon=cfg.target_epsilon, key="finetune.target_epsilon")
    planned = planned_event(noise_multiplier=sigma)
    after = ledger.ensure_affordable(planned)
    if before_training is not None:
        before_training(planned)
    log.info("dpsgd: %d texts, %d steps at q = %.4g, σ = %.4g, clip C = %g; the run's total will be %s (record-level)",
             len(train_y), schedule.steps, schedule.sample_rate, sigma, cfg.max_grad_norm, after)
    warn_insecure_rng(params, STAGE, "DP-SGD's noise and lot sampling come", flow_warns=True)
    with warnings.catch_warnings():
        if not params.privacy.secure_rng:
            warnings.simplefilter("ignore")  # the flow has warned through its logger
        settings = DpSgdSettings(noise_multiplier=sigma, max_grad_norm=cfg.max_grad_norm,
                                 lot_size=min(cfg.lot_size, len(train_y)), epochs=cfg.epochs,
                                 learning_rate=cfg.learning_rate, lr_schedule=cfg.lr_schedule, lr_end=cfg.lr_end,
                                 lr_decay_epochs=cfg.lr_decay_epochs, momentum=cfg.momentum, clipping=cfg.clipping,
                                 grad_sample_mode=cfg.grad_sample_mode, max_physical_batch=cfg.max_physical_batch,
                                 ema_decay=cfg.ema_decay, secure_rng=params.privacy.secure_rng, seed=params.run.seed)
        result = train_dpsgd(model, train_x, train_y, settings, device=training_device(params))
    ran = dataclasses.replace(result.event, stage=STAGE)
    if ran != planned:
        raise RuntimeError(f"DP-SGD ran {ran}, not the planned {planned}; refusing to mis-account")
    ledger.record(ran)
    trained = result.model
    weights = trainable_vector(trained)
    test_inputs = (np.load(Path(features_dir) / "test_embeddings.npy"),)
    test_labels = np.load(Path(features_dir) / "test_labels.npy")
    accuracy = float((predict_batches(trained, test_inputs) == test_labels).mean())
    spend = ledger.epsilon()
    audit = text_audit(params, trained, weights, spend, features_dir=Path(features_dir),
                       test=(test_inputs, test_labels))
    steps = np.unique(np.linspace(1, schedule.steps, cfg.epsilon_curve_points).round().astype(int)).tolist()
    curve = epsilon_curve(lambda s: planned_event(noise_multiplier=sigma, steps=s), steps, delta=ledger.delta,
                          accountant=ledger.accountant)
    with staged_dir(out) as staging:
        np.save(staging / "weights.npy", weights)
        write_json(staging / "spec.json", {"model": dataclasses.asdict(spec), "classes": prepared.classes,
                                           "mode": "frozen", "max_length": params.text.max_length,
                                           "embed_batch_size": params.text.embed_batch_size,
                                           "encoder_digest": encoded.encoder_digest,
                                           "data_version": prepared.data_version, "private": True,
                                           "training": "dpsgd"})
        write_json(staging / "history.json", {"epochs": result.history, "epsilon_by_step": [
            {"step": int(s), "epsilon": e} for s, e in zip(steps, curve)]})
        write_text(staging / "ledger.json", ledger.to_json())
    log.info("dpsgd: test accuracy %.4f after %d epochs; %s for one text", accuracy, cfg.epochs, spend)
    return DpSgdTextModel(dir=out, epochs=cfg.epochs, steps=schedule.steps, sample_rate=schedule.sample_rate,
                          noise_multiplier=sigma, clip_norm=cfg.max_grad_norm, epsilon=spend.epsilon,
                          delta=spend.delta, accountant=spend.accountant, accuracy_test=accuracy,
                          privacy_audit=audit)
