"""finetune: DP-SGD on the sensitive data (projected by DP-PCA for the MLP, raw pixels for the CNN).

    privpipe stage finetune        # what dvc repro runs

Reads the ledger the earlier stages wrote, fixes σ (given, or found for
``finetune.target_epsilon`` as the run's total), refuses if the planned steps
would overspend, trains, and appends the event that actually ran.
Output: artifacts/<dataset>/finetune/{model.pt, model.json, history.json, ledger.json}.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.dp_pca import dp_pca_event
from privpipe.dpsgd import DpSgdSettings, dpsgd_schedule, train_dpsgd, train_dpsgd_local
from privpipe.federated import ClientUpdates
from privpipe.models import DIVERGED, diverged, released_model, save_released
from privpipe.privacy import Event, epsilon_curve
from privpipe.privacy.calibrate import HIGH
from tasks import paths
from tasks.common import (
    Skipped,
    skip_stage,
    stage_logger,
    staged_dir,
    use_torch_threads,
    warn_insecure_rng,
    write_json,
    write_text,
)
from tasks.device import training_device
from tasks.federated.clients import ClientJob, sequential_updates
from tasks.finetune.deployed import DpSgdModel, FinetunedModel
from tasks.finetune.federated import run_finetune_federated
from tasks.finetune.selection import plan_selection, select, split_for_selection
from tasks.finetune.start import FinetuneStart, finetune_start
from tasks.identity import MadeFrom, check_inputs
from tasks.paths import DatasetPaths
from tasks.privacy import uncovered
from tasks.privacy.ledger import calibrate_for, new_ledger
from tasks.progress import progress
from tasks.recipe import recipe_warnings

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.prepared import PreparedSets
    from tasks.projection import Projection
    from tasks.tracking import TrackedRun

__all__ = ["run_finetune", "finetune_task", "start_dir", "check_lot_size", "check_target_reachable"]


def start_dir(params: Params, where: DatasetPaths) -> Path:
    """Where finetune starts: the student (weights and ledger) when PATE ran, else DP-PCA's ledger."""
    return where.student if params.student.enabled else where.dp_pca


def check_lot_size(params: Params, records: int) -> None:
    """ConfigError when a DP-SGD lot would be larger than the sensitive set (q > 1: no Poisson sampling
    to amplify by); ``privpipe run``'s preflight calls it before any work."""
    cfg = params.finetune
    if cfg.enabled and cfg.mode == "dpsgd" and cfg.lot_size > records:
        raise ConfigError(f"finetune.lot_size: {cfg.lot_size} exceeds the {records} sensitive records")


def check_target_reachable(params: Params, records: int, *, spent: Sequence[Event] = ()) -> None:
    """Before any work (the preflight calls it): ConfigError when no σ reaches ``finetune.target_epsilon``
    after what dp_pca spends, BudgetExceeded when a fixed ``finetune.noise_multiplier`` would pass
    ``privacy.epsilon_budget`` — both known from the params and the record count, and otherwise found only
    after the earlier stages ran. PATE's data-dependent cost can only add; it is still checked when finetune
    calibrates. Costs one ε of the DP-SGD schedule (at the search's largest σ, or at the fixed one).
    ``spent``: what prepare's schema stage will charge first."""
    cfg = params.finetune
    if not cfg.enabled or cfg.mode != "dpsgd":
        return
    ledger = new_ledger(params)
    ledger.record(*spent)
    if params.dp_pca.enabled:
        sigma = params.dp_pca.noise_multiplier
        if sigma is None:
            sigma = calibrate_for(ledger, dp_pca_event, target_epsilon=params.dp_pca.epsilon, key="dp_pca.epsilon")
        ledger.record(dp_pca_event(noise_multiplier=sigma))
    schedule = dpsgd_schedule(n=records, lot_size=cfg.lot_size, epochs=cfg.epochs)
    if cfg.noise_multiplier is not None:
        ledger.ensure_affordable(schedule.event(noise_multiplier=cfg.noise_multiplier))
    elif cfg.target_epsilon is not None and ledger.epsilon([schedule.event(noise_multiplier=HIGH)]).epsilon > \
            cfg.target_epsilon:
        raise ConfigError(f"finetune.target_epsilon: target ε = {cfg.target_epsilon:g} cannot be reached at any "
                          f"noise multiplier <= {HIGH:g} (already spent: ε = {ledger.epsilon().epsilon:.4g})")


def run_finetune(params: Params, *, where: DatasetPaths | None = None,
                 updates_for: Callable[[ClientJob], ClientUpdates] = sequential_updates) -> FinetunedModel | Skipped:
    """DP-SGD (or, with ``finetune.mode: federated``, DP-FedAvg: see tasks.finetune.federated) from the
    student's weights (when PATE ran) or from scratch (on DP-PCA's ledger)."""
    where = where or paths.for_params(params)
    dp_pca_dir, out, start = where.dp_pca, where.finetune, start_dir(params, where)
    made_from = check_inputs(params, where.prepared, *dict.fromkeys([dp_pca_dir, start]))
    if not params.finetune.enabled:
        return skip_stage("finetune", out, "finetune.enabled is false: the student is deployed",
                          metrics_file=where.metrics_file("finetune"), made_from=made_from)
    use_torch_threads(params, "finetune")
    federated = params.finetune.mode == "federated"
    warn_insecure_rng(params, "finetune", "DP-FedAvg's noise and client sampling come" if federated else
                      "DP-SGD's noise and lot sampling come", flow_warns=True)
    if federated:
        return run_finetune_federated(params, where=where, start=start, made_from=made_from, updates_for=updates_for)
    log = stage_logger("finetune")
    cfg = params.finetune
    begin = finetune_start(params, sensitive=where.sensitive, dp_pca_dir=dp_pca_dir, start=start)
    ledger, records, features = begin.ledger, begin.records, begin.features
    check_lot_size(params, len(records))
    for line in recipe_warnings(params, records=len(records)):  # a written recipe this data cannot train with
        log.warning(line)
    if cfg.recipe == "auto":
        return _finetune_selected(params, begin, where=where, start=start, made_from=made_from, log=log)
    schedule = dpsgd_schedule(n=len(records), lot_size=cfg.lot_size, epochs=cfg.epochs)
    sigma = cfg.noise_multiplier
    if sigma is None:
        sigma = calibrate_for(ledger, schedule.event, target_epsilon=cfg.target_epsilon, key="finetune.target_epsilon")
        log.info("finetune: σ = %.4g reaches total ε ≤ %g", sigma, cfg.target_epsilon)
    planned = schedule.event(noise_multiplier=sigma)
    after = ledger.ensure_affordable(planned)
    log.info("finetune: %d steps at q = %.4g, σ = %.4g; run total will be %s", schedule.steps,
             schedule.sample_rate, sigma, after)

    network = begin.network(params, start=start, dp_pca_dir=dp_pca_dir, log=log)
    device = training_device(params) if cfg.processes == 1 else torch.device("cpu")  # local ranks: gloo, CPUs
    log.info("finetune: training on %s (run.device: %s)%s", device, params.run.device,
             f", data-parallel over {cfg.processes} processes" if cfg.processes > 1 else "")
    def report(h: dict[str, float]) -> None:
        loss = f", loss {h['loss']:.4f}" if uncovered.recorded(params) else ""
        log.info("finetune: epoch %d/%d%s", h["epoch"], cfg.epochs, loss)
        bar.update()

    settings = DpSgdSettings(
        noise_multiplier=sigma, max_grad_norm=cfg.max_grad_norm, lot_size=cfg.lot_size, epochs=cfg.epochs,
        learning_rate=cfg.learning_rate, lr_schedule=cfg.lr_schedule, lr_end=cfg.lr_end,
        lr_decay_epochs=cfg.lr_decay_epochs, momentum=cfg.momentum, clipping=cfg.clipping,
        grad_sample_mode=cfg.grad_sample_mode, max_physical_batch=cfg.max_physical_batch, ema_decay=cfg.ema_decay,
        secure_rng=params.privacy.secure_rng, seed=params.run.seed)
    with warnings.catch_warnings(), progress(cfg.epochs, "finetune (DP-SGD epochs)") as bar:
        if not params.privacy.secure_rng:
            warnings.simplefilter("ignore")  # the flow (or, alone, the stage) has warned through its logger
        if cfg.processes > 1:  # the ranks report nothing on the way: each epoch is logged when they are done
            result = train_dpsgd_local(cfg.processes, network, features, records.labels, settings,
                                       torch_threads=max(params.run.torch_threads, 1))
            for h in result.history:
                report(h)
        else:
            result = train_dpsgd(network, features, records.labels, settings, device=device, on_epoch=report)
    if result.event != planned:
        raise RuntimeError(f"DP-SGD ran {result.event}, not the planned {planned}; refusing to mis-account")
    ledger.record(result.event)

    if diverged(result.model, result.history[-1]["loss"]):  # never saved, let alone registered
        raise ConfigError(DIVERGED.format(key="finetune.learning_rate"))
    steps = np.unique(np.linspace(1, schedule.steps, cfg.epsilon_curve_points).round().astype(int)).tolist()
    epsilons = epsilon_curve(lambda s: schedule.event(noise_multiplier=sigma, steps=s), steps, delta=ledger.delta,
                             accountant=ledger.accountant)
    curve = [{"step": int(s), "epsilon": e} for s, e in zip(steps, epsilons)]
    model = released_model(result.model, list(begin.front))
    with staged_dir(out, made_from=made_from) as staging:
        save_released(model, staging, spec=begin.spec)
        write_json(staging / "history.json", {"epochs": result.history, "epsilon_by_step": curve})
        write_text(staging / "ledger.json", ledger.to_json())
    spend = ledger.stage_epsilon("finetune")
    deployed = DpSgdModel(model_dir=out, noise_multiplier=sigma, sample_rate=schedule.sample_rate,
                          steps=schedule.steps, epsilon=spend.epsilon, final_loss=result.history[-1]["loss"])
    write_json(where.metrics_file("finetune"), deployed.metrics(params))
    log.info("finetune: done, stage %s; run total %s", spend, ledger.epsilon())
    return deployed


def _finetune_selected(params: Params, begin: FinetuneStart, *, where: DatasetPaths, start: Path,
                       made_from: MadeFrom, log: logging.Logger | logging.LoggerAdapter) -> DpSgdModel:
    """finetune.recipe auto: the recipe chosen privately (tasks.finetune.selection), its model released."""
    cfg = params.finetune
    ledger, records, features = begin.ledger, begin.records, begin.features
    validation = split_for_selection(records.ids, seed=params.run.seed, validation_fraction=cfg.validation_fraction)
    if validation.all() or not validation.any():
        raise ConfigError(f"finetune.validation_fraction: {cfg.validation_fraction:g} of {len(records)} records "
                          "leaves one part empty")
    check_lot_size(params, int((~validation).sum()))
    plan = plan_selection(params, ledger, training_records=int((~validation).sum()))
    after = ledger.ensure_affordable(plan.event)
    log.info("finetune: recipe auto: %d candidates, each at σ for ε %.4g alone; E[K] = %g runs (%s); run total "
             "will be %s", len(plan.candidates), plan.run_epsilon, cfg.selection_runs, cfg.selector, after)
    device = training_device(params)
    with warnings.catch_warnings():
        # every run's warnings silenced, whatever they are: how many times one came would tell K
        warnings.simplefilter("ignore")
        chosen = select(params, plan, features=features, labels=records.labels, validation=validation,
                        initial=begin.network(params, start=start, dp_pca_dir=where.dp_pca, log=log), device=device)
    ledger.record(plan.event)
    result = chosen.result
    if diverged(result.model, result.history[-1]["loss"]):
        raise ConfigError(DIVERGED.format(key="finetune.learning_rate"))
    model = released_model(result.model, list(begin.front))
    choice = {"candidate": chosen.candidate.name, "epochs": chosen.candidate.epochs,
              "learning_rate": chosen.candidate.learning_rate, "noisy_validation_correct": chosen.noisy_score,
              "selector": cfg.selector, "mean_runs": cfg.selection_runs}
    out = where.finetune
    with staged_dir(out, made_from=made_from) as staging:
        save_released(model, staging, spec=begin.spec)
        # the released run's own history only: the others' (and how many there were) stay unreleased
        write_json(staging / "history.json", {"epochs": result.history, "epsilon_by_step": [], "selection": choice})
        write_text(staging / "ledger.json", ledger.to_json())
    spend = ledger.stage_epsilon("finetune")
    deployed = DpSgdModel(model_dir=out, noise_multiplier=chosen.sigma, sample_rate=chosen.schedule.sample_rate,
                          steps=chosen.schedule.steps, epsilon=spend.epsilon, final_loss=result.history[-1]["loss"])
    write_json(where.metrics_file("finetune"), deployed.metrics(params))
    log.info("finetune: recipe chosen privately: %s (epochs %d, lr %g; noisy validation score %.1f of %d); stage %s; "
             "run total %s", chosen.candidate.name, chosen.candidate.epochs, chosen.candidate.learning_rate,
             chosen.noisy_score, chosen.validation_records, spend, ledger.epsilon())
    return deployed


@task(name="finetune", cache_policy=NO_CACHE)
def finetune_task(params: Params, run: TrackedRun, prepared: PreparedSets, projection: Projection,
                  before_release: Callable[[], None] | None = None) -> FinetunedModel:
    """DP-SGD (federated rounds run in the flow, so that their client updates are mapped tasks); then the
    stage's figures and curves in MLflow. ``before_release``: called once training is done, before those
    figures leave (the flow's lifetime budget: from then on, the run has released its model's figures)."""
    deployed = run_finetune(params, where=prepared.where)
    if isinstance(deployed, Skipped):
        raise RuntimeError("finetune_task runs only when finetune.enabled is true")
    if before_release is not None:
        before_release()
    deployed.log(run, params)
    return deployed
