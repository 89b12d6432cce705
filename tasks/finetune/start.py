"""What both finetune modes (DP-SGD, DP-FedAvg) start from: the earlier stages' ledger, the
sensitive records through the model's frozen front, and the network to train (the student's,
or a fresh one)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privpipe.config import ConfigError, Params
from privpipe.data import DATASET_CLASSES, Records
from privpipe.models import apply_front, front_layers, load_released, make_network, network_maps, seeded
from privpipe.privacy import Ledger
from tasks.common import read_json, seed_for
from tasks.features import feature_transform, transform_spec
from tasks.privacy.ledger import load_ledger
from tasks.projection import check_projection, load_projection

__all__ = ["FinetuneStart", "finetune_start"]


@dataclass
class FinetuneStart:
    ledger: Ledger
    records: Records
    projection: np.ndarray | None
    transform: torch.nn.Module | None  # the fixed feature transform (features.transform), part of the front
    front: torch.nn.Sequential  # the frozen preprocessing (no parameters)
    features: np.ndarray  # the records through the front, computed once rather than every step
    classes: int  # the task's label set: public, never read off the labels

    def released_spec(self, params: Params) -> dict[str, Any]:
        cfg = params.finetune
        return {"model": cfg.model, "input_dim": int(self.records.features.shape[1]),
                "projection_dim": None if self.projection is None else int(self.projection.shape[1]),
                "hidden_units": list(cfg.hidden_units), "classes": self.classes, "input_scale": cfg.input_scale,
                **transform_spec(params)}

    def network(self, params: Params, *, start: Path, dp_pca_dir: Path,
                log: logging.Logger | logging.LoggerAdapter) -> torch.nn.Module:
        """The student's trainable part when ``start`` holds one (checked against this DP-PCA), else fresh."""
        if (start / "model.pt").exists():
            check_projection(read_json(start / "model.json").get("dp_pca_digest", ""), dp_pca_dir,
                             source=start, rerun="student")
            log.info("finetune: starting from the student in %s", start)
            return load_released(start)[-1]  # the front is rebuilt when the model is released
        cfg = params.finetune
        # seeded: the default run starts here (no student), and its weights must repeat for a seed
        seed = int(seed_for(params.run.seed, "finetune_init").generate_state(1)[0])
        try:
            return seeded(seed, lambda: make_network(cfg.model, in_features=int(np.prod(self.features.shape[1:])),
                                                     hidden_units=cfg.hidden_units, classes=self.classes,
                                                     maps=network_maps(cfg.model, self.transform)))
        except ValueError as exc:
            raise ConfigError(f"finetune.model: {exc}") from None


def finetune_start(params: Params, *, sensitive: Path, dp_pca_dir: Path, start: Path) -> FinetuneStart:
    cfg = params.finetune
    ledger = load_ledger(start / "ledger.json", params)
    records = Records.load(sensitive)
    projection = load_projection(dp_pca_dir)
    if cfg.model == "cnn" and projection is not None:
        raise ConfigError("finetune.model: cnn trains on raw pixels; set dp_pca.enabled: false")
    transform = feature_transform(params, records.features.shape[1])
    front = torch.nn.Sequential(*front_layers(cfg.model, projection, input_scale=cfg.input_scale, transform=transform))
    return FinetuneStart(ledger=ledger, records=records, projection=projection, transform=transform, front=front,
                         features=apply_front(front, records.features),
                         classes=DATASET_CLASSES[params.prepare.dataset])
