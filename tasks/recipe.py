"""A recipe that fits the data: where a params file sets none of the recipe keys, the model family, epochs,
lot size and learning rate follow from the data's kind, image side and record count and the ε left to train.

    params = load_run_params("clinic.yaml")   # load_params, then the fitted recipe where none is written
    for line in recipe_warnings(params, records=100):
        log.warning(line)                     # a written recipe that cannot work on this data

The recipes were chosen on validation splits (bench/own_data_defaults.py, bench/own_data_tabular.py):

- **images** (imagefolder, cifar10, svhn; any side and channel count): Tramèr & Boneh's (2021) CNN on a
  ScatterNet front (features.transform scatternet, J = 2, or 1 below 16 pixels a side; no DP-PCA), lots of
  up to 256, clip 0.1, lr 1 with momentum 0.9, about 8 epochs per unit of ε (at most 40);
- **tables** (csv): ``TABLE_RULE`` — a linear model on the schema's scaled columns, lots of n/16 (32 to 512);
  its epochs, learning rate and clip chosen among ``TableRule`` candidates on validation projects of breast
  cancer's and wine's training rows, whose lockbox test rows (and iris, held out) had no say
  (``bench/own_data_defaults.py --part choose`` → bench/out/own_data/recipe_choice.md).

digits and mnist keep the defaults tuned for them (params.yaml). The record count (the public size of the
data, as DP-SGD's sampling rate already takes it) and the image side are read from the files, nothing else.
A file that writes any recipe key keeps its own recipe: a half-fitted one would mix two recipes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from privpipe.config import ConfigError, Params, load_params
from privpipe.config.params import check_all
from privpipe.config.prepare import DATA_KINDS
from privpipe.data.sources import data_source
from privpipe.files import read_user_text
from tasks.common import stage_logger
from tasks.discovery import discovery_plan

__all__ = ["RECIPE_KEYS", "Recipe", "TableRule", "TABLE_RULE", "fitted_recipe", "load_run_params", "recipe_warnings",
           "training_records"]

#: the keys a recipe is made of, by section: a params file that sets none of them gets the fitted one
RECIPE_KEYS: Mapping[str, tuple[str, ...]] = {
    "features": ("transform", "scatter_j"),
    "dp_pca": ("enabled", "components"),
    "finetune": ("model", "hidden_units", "epochs", "lot_size", "learning_rate", "lr_schedule", "momentum",
                 "max_grad_norm"),
}
SCATTER_MIN_SIDE = 16  # below it J = 1 (2^J must stay <= side/2)


@dataclass(frozen=True)
class Recipe:
    """A recipe's values, by section and key (the fields RECIPE_KEYS names)."""

    values: Mapping[str, Mapping[str, Any]]
    why: str  # one line for the log: what it was fitted to

    def applied(self, params: Params) -> Params:
        sections = {name: dataclasses.replace(getattr(params, name), **values) for name, values in self.values.items()}
        fitted = dataclasses.replace(params, **sections)
        check_all(fitted)
        return fitted


def _power_of_two(value: float, low: int, high: int) -> int:
    return int(min(max(2 ** round(math.log2(max(value, 1.0))), low), high))


@dataclass(frozen=True)
class TableRule:
    """A table's recipe as a rule of its training-row count: plain SGD (no momentum, constant rate) on the
    schema's scaled columns, lots of ``records / lot_divisor`` rounded to a power of two in [32, 512]."""

    hidden_units: tuple[int, ...]
    epochs: int
    learning_rate: float
    max_grad_norm: float
    lot_divisor: int = 16

    @property
    def text(self) -> str:
        shape = "linear" if not self.hidden_units else f"MLP {list(self.hidden_units)}"
        return f"{shape}, {self.epochs} epochs, lr {self.learning_rate:g}, clip {self.max_grad_norm:g}"

    def recipe(self, records: int) -> Recipe:
        lot = _power_of_two(records / self.lot_divisor, 32, 512)
        return Recipe({"features": {"transform": "none"}, "dp_pca": {"enabled": False},
                       "finetune": {"model": "mlp", "hidden_units": self.hidden_units, "epochs": self.epochs,
                                    "lot_size": lot, "learning_rate": self.learning_rate, "lr_schedule": "constant",
                                    "momentum": 0.0, "max_grad_norm": self.max_grad_norm}},
                      f"a table of ~{records} training rows: {self.text}, lots of {lot}")


#: the table default: bench/out/own_data/recipe_choice.md's best (DP-SGD on a few hundred rows cannot afford a
#: hidden layer)
TABLE_RULE = TableRule(hidden_units=(), epochs=100, learning_rate=0.25, max_grad_norm=0.5)


def fitted_recipe(*, kind: str, records: int, side: int | None, train_epsilon: float) -> Recipe:
    """The recipe for ``records`` sensitive records of ``kind`` (images ``side`` pixels a side), trained at
    ``train_epsilon`` (what is left for DP-SGD after the stages before it)."""
    if not DATA_KINDS[kind].images:
        return TABLE_RULE.recipe(records)
    if side is None:
        raise ValueError(f"an image kind ({kind}) needs its side")
    lot = _power_of_two(records / 8, 32, 256)
    epochs = int(min(max(round(8 * train_epsilon), 5), 40))
    scatter_j = 2 if side >= SCATTER_MIN_SIDE else 1
    return Recipe({"features": {"transform": "scatternet", "scatter_j": scatter_j}, "dp_pca": {"enabled": False},
                   "finetune": {"model": "cnn", "epochs": epochs, "lot_size": lot, "learning_rate": 1.0,
                                "lr_schedule": "constant", "momentum": 0.9, "max_grad_norm": 0.1}},
                  f"~{records} training images of {side}×{side}: ScatterNet (J = {scatter_j}) and its CNN, "
                  f"{epochs} epochs at ε {train_epsilon:.3g}, lots of {lot}")


def _written_recipe_keys(path: Path) -> list[str]:
    raw = yaml.safe_load(read_user_text(path, error=ConfigError)) or {}  # load_params has checked it already
    return [f"{section}.{key}" for section, keys in RECIPE_KEYS.items()
            for key in keys if isinstance(raw.get(section), Mapping) and key in raw[section]]


def _image_side(params: Params) -> int:
    cfg = params.prepare
    if cfg.image_size is not None:
        return cfg.image_size
    if cfg.kind.side is not None:
        return cfg.kind.side
    from PIL import Image  # deferred: only image folders are opened, and only their first image

    first = next(iter(data_source(cfg.dataset).files(cfg)), None)
    if first is None:
        return SCATTER_MIN_SIDE  # an empty folder: prepare refuses it, naming it
    with Image.open(first) as image:
        return min(image.size)


def training_records(params: Params) -> int:
    """How many records DP-SGD trains on: the file's, less the test share and public pool where they are shares."""
    cfg = params.prepare
    records = data_source(cfg.dataset).training_count(cfg)  # (test_path's and the public pool's not counted)
    if cfg.own_test_set:
        return records
    return int(records * (1 - cfg.test_fraction - (cfg.public_fraction if cfg.public_path is None else 0.0)))


def train_epsilon(params: Params) -> float:
    """The ε DP-SGD is given: its target, less the schema stage's share where a schema is discovered."""
    target = params.finetune.target_epsilon or params.privacy.epsilon_budget
    if discovery_plan(params) is None:
        return target
    return target - params.schema.stage_epsilon(params.privacy.epsilon_budget)


def load_run_params(path: str | Path) -> Params:
    """The params a pipeline run uses: the file's, with the fitted recipe where it writes none (and the kind
    has no tuned defaults, and its data is there to be counted)."""
    params = load_params(path)
    if params.prepare.kind.tuned_defaults or _written_recipe_keys(Path(path)):
        return params
    if not Path(params.prepare.path).exists():
        return params  # prepare names the missing file
    side = _image_side(params) if params.prepare.images else None
    recipe = fitted_recipe(kind=params.prepare.dataset, records=training_records(params), side=side,
                           train_epsilon=train_epsilon(params))
    stage_logger("recipe").info("recipe: none written in %s; fitted to the data: %s", path, recipe.why)
    return recipe.applied(params)


def recipe_warnings(params: Params, *, records: int) -> list[str]:
    """A line for each way a written recipe cannot work on ``records`` training records."""
    cfg = params.finetune
    if not cfg.enabled or cfg.mode != "dpsgd":
        return []
    lines = []
    steps = cfg.epochs * max(records // max(cfg.lot_size, 1), 1)
    if steps < 100:
        lines.append(f"finetune: {cfg.epochs} epoch(s) in lots of {cfg.lot_size} over {records} records is {steps} "
                     "DP-SGD steps, too few to learn under noise (raise finetune.epochs, or leave the recipe keys "
                     "out for one fitted to the data)")
    if cfg.lot_size * 4 > records:
        lines.append(f"finetune: lots of {cfg.lot_size} over {records} records sample over a quarter of the data a "
                     "step: little amplification, much noise (lower finetune.lot_size)")
    if params.prepare.images and params.prepare.kind.channels == 3 and params.features.transform == "none" \
            and cfg.model == "mlp":
        lines.append("finetune: an MLP on raw or DP-PCA-projected pixels learns little of colour or larger images "
                     "under DP (features.transform: scatternet with finetune.model: cnn does; or leave the recipe "
                     "keys out)")
    return lines
