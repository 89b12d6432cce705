"""finetune.recipe: auto — the recipe chosen privately among a short list of candidates (privpipe.selection).

The sensitive records are split by a keyed per-record draw into a training part and a validation part
(``finetune.validation_fraction``). One run picks a candidate at random (secret coins: the runs are then
alike, as the analysis needs), trains it with
DP-SGD on the training part and scores it by its count of correct validation predictions plus Gaussian
noise. The selector draws K (secret) and releases the best-scored run's model, its candidate and its noisy
score, nothing of the other runs: not K, not their scores, not their logs.

Accounting (Papernot & Steinke 2022, Theorem 2): a record lies in one part, so one run's RDP at each order
is the larger of its training's and its score's (the score's noise is set so that it is never the larger),
and over the random candidate the largest candidate's (joint convexity). The selection's curve from that
is one RdpCurveEvent, ``finetune``, on the run's ledger. Every candidate is calibrated to one per-run ε,
found by bisection so that the run's total, the earlier stages and the selection included, is at most
``finetune.target_epsilon``.

Candidates vary the optimisation (learning rate, epochs), never the architecture, which stays the written or
fitted one (tasks.recipe): the released model's spec is the stage's.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from privpipe.config import ConfigError, Params
from privpipe.data.split import keyed_uniforms
from privpipe.dpsgd import DpSgdSchedule, DpSgdSettings, dpsgd_schedule, train_dpsgd
from privpipe.dpsgd.train import DpSgdResult
from privpipe.privacy import Event, Ledger, NoiseSource, RdpCurveEvent
from privpipe.privacy.calibrate import calibrate_noise_multiplier
from privpipe.privacy.ledger import RDP_ORDERS
from privpipe.selection import Selector, make_selector

__all__ = ["Candidate", "candidates", "SelectionPlan", "plan_selection", "Selected", "select"]

SELECTION_DOMAIN = "selection"  # the keyed draw that splits training and validation records


@dataclass(frozen=True)
class Candidate:
    """A recipe to try: the finetune keys it changes."""

    name: str
    epochs: int
    learning_rate: float


def candidates(params: Params) -> list[Candidate]:
    """The written (or fitted) recipe, a larger and a smaller learning rate, and half its epochs."""
    cfg = params.finetune
    epochs, rate = cfg.epochs, cfg.learning_rate
    return [Candidate("as written", epochs, rate), Candidate("lr x4", epochs, rate * 4),
            Candidate("lr /4", epochs, rate / 4), Candidate("half the epochs", max(epochs // 2, 1), rate)]


@dataclass(frozen=True)
class SelectionPlan:
    """Each candidate's schedule and σ, the score's noise, and the selection's ledger event."""

    candidates: tuple[Candidate, ...]
    schedules: tuple[DpSgdSchedule, ...]
    sigmas: tuple[float, ...]
    score_sigma: float
    event: RdpCurveEvent
    run_epsilon: float  # what each candidate alone is calibrated to (RDP at the run's δ)


def split_for_selection(ids: np.ndarray, *, seed: int, validation_fraction: float) -> np.ndarray:
    """True for a validation record: a keyed draw of the record's id alone (stable under erasure)."""
    return keyed_uniforms(ids, seed=seed, domain=SELECTION_DOMAIN) < validation_fraction


def _rdp(event: Event) -> np.ndarray:
    return np.asarray(event.rdp_at(RDP_ORDERS), dtype=float)


def _alone(schedule: DpSgdSchedule, delta: float) -> Callable[[float], float]:
    """σ → the schedule's own ε at ``delta`` by RDP (the selection's analysis is in RDP)."""
    return lambda sigma: Ledger(epsilon_budget=math.inf, delta=delta, accountant="rdp",
                                events=[schedule.event(noise_multiplier=sigma)]).epsilon().epsilon


def plan_selection(params: Params, ledger: Ledger, *, training_records: int) -> SelectionPlan:
    """The σ of every candidate and the selection's event, such that the ledger's total after it is at most
    finetune.target_epsilon (ConfigError when no σ gets there)."""
    cfg = params.finetune
    if cfg.target_epsilon is None:
        raise ConfigError("finetune.target_epsilon: finetune.recipe auto calibrates every candidate to it")
    tried = tuple(candidates(params))
    schedules = tuple(dpsgd_schedule(n=training_records, lot_size=cfg.lot_size, epochs=c.epochs) for c in tried)
    selector = make_selector(cfg.selector, mean_runs=cfg.selection_runs)
    delta = ledger.delta

    def calibrated(run_epsilon: float) -> tuple[tuple[float, ...], float, RdpCurveEvent]:
        sigmas = tuple(calibrate_noise_multiplier(_alone(sch, delta), target_epsilon=run_epsilon, rel_tol=1e-3)
                       for sch in schedules)
        run = np.max([_rdp(sch.event(noise_multiplier=s)) for sch, s in zip(schedules, sigmas)], axis=0)
        # the score's Gaussian (sensitivity one count) never above the training's RDP at any order
        score_sigma = float(np.sqrt(np.max(np.asarray(RDP_ORDERS) / (2 * run))))
        event = RdpCurveEvent(stage="finetune", orders=RDP_ORDERS, rdp=tuple(selector.rdp(RDP_ORDERS, run)))
        return sigmas, score_sigma, event

    def total(run_epsilon: float) -> float:
        try:
            return ledger.epsilon([calibrated(run_epsilon)[2]]).epsilon
        except ValueError:  # a per-run ε no σ reaches
            return math.inf

    target = cfg.target_epsilon
    low, high = 0.02 * target, target
    if total(low) > target:
        raise ConfigError(f"finetune.target_epsilon: {target:g} cannot pay for the selection (E[K] = "
                          f"{cfg.selection_runs:g} runs) after the earlier stages (ε = {ledger.epsilon().epsilon:.4g})")
    for _ in range(40):  # bisection on the per-run ε: the total rises with it
        middle = (low + high) / 2
        low, high = (middle, high) if total(middle) <= target else (low, middle)
        if high - low < 1e-3 * target:
            break
    sigmas, score_sigma, event = calibrated(low)
    return SelectionPlan(tried, schedules, sigmas, score_sigma, event, low)


@dataclass(frozen=True)
class Selected:
    """The released run: its candidate, its noisy score, its schedule and σ, and its trained model."""

    candidate: Candidate
    noisy_score: float  # correct validation predictions + N(0, score_sigma²): released with the model
    validation_records: int
    schedule: DpSgdSchedule
    sigma: float
    result: DpSgdResult


def _correct(model: torch.nn.Module, features: np.ndarray, labels: np.ndarray) -> int:
    model.eval()
    with torch.no_grad():
        predicted = model(torch.as_tensor(features, dtype=torch.float32)).argmax(dim=1).numpy()
    return int((predicted == labels).sum())


def select(params: Params, plan: SelectionPlan, *, features: np.ndarray, labels: np.ndarray, validation: np.ndarray,
           initial: torch.nn.Module, device: torch.device) -> Selected:
    """Run the selection: K runs (K from the selector, secret), the best-scored one released. ``initial``: the
    network every run starts from (a copy each; built once, so that nothing is logged per run)."""
    cfg = params.finetune
    selector: Selector = make_selector(cfg.selector, mean_runs=cfg.selection_runs)
    secret = NoiseSource(seed=np.random.SeedSequence([params.run.seed, 0x5E1EC7]), secure=params.privacy.secure_rng)
    runs = selector.draw_runs(secret)
    train = ~validation
    best: Selected | None = None
    for run in range(runs):
        # each run draws its candidate from the secret source too: the runs must be alike (iid) for Theorem 2
        pick = min(int(secret.uniform(1)[0] * len(plan.candidates)), len(plan.candidates) - 1)
        candidate, schedule, sigma = plan.candidates[pick], plan.schedules[pick], plan.sigmas[pick]
        settings = DpSgdSettings(
            noise_multiplier=sigma, max_grad_norm=cfg.max_grad_norm,
            lot_size=cfg.lot_size, epochs=candidate.epochs, learning_rate=candidate.learning_rate,
            lr_schedule=cfg.lr_schedule, lr_end=cfg.lr_end, lr_decay_epochs=cfg.lr_decay_epochs,
            momentum=cfg.momentum, clipping=cfg.clipping, grad_sample_mode=cfg.grad_sample_mode,
            max_physical_batch=cfg.max_physical_batch, ema_decay=cfg.ema_decay,
            secure_rng=params.privacy.secure_rng, seed=params.run.seed * 1009 + run)
        result = train_dpsgd(copy.deepcopy(initial), features[train], labels[train], settings, device=device)
        if result.event != schedule.event(noise_multiplier=sigma):
            raise RuntimeError(f"DP-SGD ran {result.event}, not the planned one; refusing to mis-account")
        score = _correct(result.model, features[validation], labels[validation]) + float(
            secret.normal((1,), std=plan.score_sigma)[0])
        if best is None or score > best.noisy_score:
            best = Selected(candidate, score, int(validation.sum()), schedule, sigma, result)
    assert best is not None  # K >= 1
    return best
