"""finetune: DP-SGD on the sensitive data (or DP-FedAvg, mode federated), starting from the student.

Its checks are four functions because they run at four points of check_all's order (params.py):
the first failing check is the one reported, and that order is kept as it always was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.choices import Choice, Variant
from privpipe.config.dp_pca import DpPcaConfig
from privpipe.config.errors import noise_or_epsilon, one_of, require
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
from privpipe.config.teachers import MODELS

FINETUNE_MODES = ("dpsgd", "federated")
LR_SCHEDULES = ("constant", "linear_then_constant", "cosine")  # privpipe.dpsgd.schedule follows each
CLIPPINGS = ("flat", "per_layer")
#: Opacus' grad_sample_modes (privpipe.dpsgd.opacus_engine runs each)
OPACUS_MODES = ("ghost", "hooks", "functorch", "ew")
#: finetune.grad_sample_mode: DP-SGD's engines (privpipe.dpsgd.engines), each line naming its class
GRAD_SAMPLE_MODES: Choice[Variant] = Choice("finetune.grad_sample_mode", [
    Variant(tag="bk", implementation="privpipe.dpsgd.train:BookKeepingEngine"),  # book-keeping: one backward pass
    # Opacus' engine, in the mode of that name
    *(Variant(tag=mode, implementation="privpipe.dpsgd.opacus_engine:OpacusEngine") for mode in OPACUS_MODES),
])


RECIPES = ("as_written", "auto")
#: finetune.selector: how many candidate runs the private selection makes (privpipe.selection.selectors)
SELECTORS: Choice[Variant] = Choice("finetune.selector", [
    Variant(tag="logarithmic", implementation="privpipe.selection.selectors:LogarithmicSelector"),
    Variant(tag="geometric", implementation="privpipe.selection.selectors:GeometricSelector"),
])


@dataclass(frozen=True)
class FinetuneConfig:
    #: false: deploy the student as it is
    enabled: bool = True
    #: dpsgd (record-level, the keys below) | federated (DP-FedAvg over clients: the federated section)
    mode: str = "dpsgd"
    #: the deployed model (student and fine-tuned): mlp (on the DP-PCA features) | cnn (tanh CNN on raw 28×28 pixels,
    #: or Tramèr & Boneh's CNN on ScatterNet maps with features.transform: scatternet; needs dp_pca.enabled: false)
    model: str = "mlp"
    #: ReLU MLP on the projected features (Abadi et al. use one 1000-unit layer)
    hidden_units: tuple[int, ...] = (1000,)  # Abadi et al.'s MNIST network: one 1000-unit layer
    #: mlp: fixed factor on the unit-norm projected features (data-independent; order-one inputs train better)
    input_scale: float = 8.0  # order-one inputs train better, and a fixed factor costs no privacy
    #: passes over the sensitive set (steps = epochs / sampling rate); under target_epsilon σ is solved for these steps
    epochs: int = 30
    #: expected Poisson lot size L; sample rate q = 1/ceil(n/L) ≈ L/n
    lot_size: int = 64
    #: SGD's learning rate; the schedule's start when lr_schedule is linear_then_constant or cosine
    learning_rate: float = 0.1
    #: constant | linear_then_constant (Abadi et al.: decay over the first epochs) | cosine (to lr_end over the run)
    lr_schedule: str = "constant"
    #: linear_then_constant: rate reached after lr_decay_epochs, then held; cosine: the rate at the run's end
    # Abadi et al.'s schedule when lr_schedule is linear_then_constant: 0.1 → 0.052 over 10 epochs
    lr_end: float = 0.052
    #: linear_then_constant: epochs over which the rate falls from learning_rate to lr_end
    lr_decay_epochs: int = 10
    #: SGD momentum (0 = plain SGD, as in Abadi et al.)
    momentum: float = 0.0
    #: per-example clipping bound C
    max_grad_norm: float = 1.0
    #: flat | per_layer (C split equally over layers: C/sqrt(#layers) each)
    clipping: str = "flat"
    #: σ; or null and set target_epsilon
    noise_multiplier: float | None = None
    #: find σ so that the run's total ε after this stage (earlier stages included) is at most this
    target_epsilon: float | None = 3.0  # σ is calibrated to what is left of the budget instead of guessed
    #: per-example clipping: bk (book-keeping, one backward pass; Linear and Conv2d) | Opacus': ghost | hooks |
    #: functorch | ew
    # bk: book-keeping, one backward pass (docs/benchmarks.md); ghost, hooks, functorch, ew: Opacus' engines
    grad_sample_mode: str = "bk"
    #: bk: records per forward/backward pass within a lot (memory stays flat in lot_size); null: whole lots
    max_physical_batch: int | None = None  # records per forward/backward pass within a lot (bk); None: the whole lot
    #: bk, on CPUs (run.device auto trains on the CPU then): DP-SGD data-parallel over this many processes of this
    #: machine (torch.distributed, gloo): each clips its share of every lot, the sums are all-reduced and the noise
    #: added once, so the mechanism and its ε are one process's; 1: this process alone
    processes: int = 1  # data-parallel ranks (privpipe.dpsgd.distributed); 1: none
    #: bk: release the exponential moving average of the iterates (e.g. 0.998 per step; post-processing, free); 0: the
    #: last iterate
    ema_decay: float = 0.0  # bk: release an exponential moving average of the iterates (per step); 0: the last one
    #: ε over steps is logged at this many evenly spaced steps
    epsilon_curve_points: int = 20
    #: as_written (the keys above, or the recipe fitted to the data where none is written) | auto (chosen privately
    #: among a short list around it on a validation split of the sensitive records: tasks/finetune/selection.py)
    recipe: str = "as_written"
    #: auto: logarithmic (Papernot & Steinke 2022, η = 0) | geometric (Liu & Talwar 2019's stopping, η = 1)
    selector: str = "logarithmic"
    #: auto: the mean number of training runs E[K] (the selection's cost grows with log E[K])
    selection_runs: float = 4.0
    #: auto: the share of the sensitive records held out to score the runs (the released model trains on the rest)
    validation_fraction: float = 0.2

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {
        "hidden_units": at_least(1, 10**6), "input_scale": above(0, MAX_SCALE), "epochs": at_least(1, MAX_EPOCHS),
        "lot_size": at_least(1, MAX_COUNT), "learning_rate": above(0, MAX_RATE), "lr_end": above(0, MAX_RATE),
        "lr_decay_epochs": at_least(1, MAX_EPOCHS), "momentum": fraction(zero=True),
        "max_grad_norm": above(0, MAX_SCALE), "noise_multiplier": above(0, MAX_SCALE),
        "target_epsilon": above(0, MAX_EPSILON), "max_physical_batch": at_least(1, MAX_BATCH),
        "processes": at_least(1, 256),
        "ema_decay": fraction(zero=True), "epsilon_curve_points": at_least(2, 10**4),
        "selection_runs": above(1, 100), "validation_fraction": fraction(),
    }


def check_processes(finetune: FinetuneConfig, *, device: str) -> None:
    """Data-parallel DP-SGD's conditions: bk's loop, one as-written run, ranks on CPUs (gloo)."""
    if finetune.processes == 1:
        return
    require(finetune.mode == "dpsgd" and finetune.recipe == "as_written", "finetune.processes",
            "data-parallel ranks train one DP-SGD run (finetune.mode: dpsgd, recipe: as_written)")
    require(finetune.grad_sample_mode == "bk", "finetune.processes", "data-parallel DP-SGD needs grad_sample_mode: bk")
    require(device != "cuda", "finetune.processes",
            "local ranks run on CPUs (gloo), not run.device: cuda; on GPUs start one rank per GPU with torchrun "
            "and privpipe.dpsgd.train_dpsgd_distributed (NCCL)")


def check_something_to_deploy(finetune: FinetuneConfig, *, student_enabled: bool) -> None:
    require(student_enabled or finetune.enabled, "finetune.enabled",
            "with student.enabled also false there is no model to deploy")


def check(finetune: FinetuneConfig, *, dp_pca: DpPcaConfig, privacy: PrivacyConfig) -> None:
    one_of(finetune.model, MODELS, "finetune.model")
    one_of(finetune.recipe, RECIPES, "finetune.recipe")
    SELECTORS.check(finetune.selector)
    if finetune.recipe == "auto":
        require(finetune.mode == "dpsgd", "finetune.recipe", "auto selects among DP-SGD runs (finetune.mode: dpsgd)")
        require(finetune.noise_multiplier is None and finetune.target_epsilon is not None, "finetune.recipe",
                "auto calibrates every candidate to finetune.target_epsilon (set noise_multiplier: null)")
        require(finetune.selection_runs > 1, "finetune.selection_runs", "must be > 1 (the mean number of runs)")
        require(0 < finetune.validation_fraction < 1, "finetune.validation_fraction", "must be in (0, 1)")
    require(finetune.model != "cnn" or not dp_pca.enabled, "finetune.model",
            "cnn trains on raw pixels; set dp_pca.enabled: false")
    require(all(h >= 1 for h in finetune.hidden_units), "finetune.hidden_units", "every layer needs >= 1 unit")
    require(finetune.input_scale > 0, "finetune.input_scale", "must be > 0")
    require(finetune.epochs >= 1, "finetune.epochs", "must be >= 1")
    require(finetune.lot_size >= 1, "finetune.lot_size", "must be >= 1")
    require(finetune.learning_rate > 0, "finetune.learning_rate", "must be > 0")
    one_of(finetune.lr_schedule, LR_SCHEDULES, "finetune.lr_schedule")
    require(finetune.lr_end > 0, "finetune.lr_end", "must be > 0")
    require(finetune.lr_decay_epochs >= 1, "finetune.lr_decay_epochs", "must be >= 1")
    require(0 <= finetune.momentum < 1, "finetune.momentum", "must be in [0, 1)")
    require(finetune.max_grad_norm > 0, "finetune.max_grad_norm", "must be > 0 (it bounds each example's influence)")
    one_of(finetune.clipping, CLIPPINGS, "finetune.clipping")
    GRAD_SAMPLE_MODES.check(finetune.grad_sample_mode)
    require(0 <= finetune.ema_decay < 1, "finetune.ema_decay", "must be in [0, 1)")
    require(finetune.ema_decay == 0 or finetune.grad_sample_mode == "bk", "finetune.ema_decay",
            "weight averaging needs grad_sample_mode: bk")
    if finetune.max_physical_batch is not None:
        require(finetune.max_physical_batch >= 1, "finetune.max_physical_batch", "must be >= 1 (or null: whole lots)")
        require(finetune.grad_sample_mode == "bk", "finetune.max_physical_batch",
                "splitting a lot into physical batches needs grad_sample_mode: bk")
    noise_or_epsilon("finetune", finetune.noise_multiplier, "target_epsilon", finetune.target_epsilon)
    if finetune.target_epsilon is not None:
        require(finetune.target_epsilon <= privacy.epsilon_budget, "finetune.target_epsilon",
                f"exceeds privacy.epsilon_budget ({privacy.epsilon_budget})")
    require(finetune.epsilon_curve_points >= 2, "finetune.epsilon_curve_points", "must be >= 2")


def check_mode(finetune: FinetuneConfig) -> None:
    one_of(finetune.mode, FINETUNE_MODES, "finetune.mode")


def check_clipping_engine(finetune: FinetuneConfig) -> None:
    if finetune.clipping == "per_layer":
        require(finetune.grad_sample_mode != "ghost", "finetune.clipping",
                "per_layer clipping is not supported with ghost clipping")
