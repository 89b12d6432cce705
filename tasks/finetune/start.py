"""What both finetune modes (DP-SGD, DP-FedAvg) start from: the earlier stages' ledger, the
sensitive records through the model's frozen front, and the network to train (the student's,
or a fresh one)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from privpipe.config import ConfigError, Params
from privpipe.data import Records
from privpipe.models import ModelSpec, apply_front, load_released, seeded
from privpipe.privacy import Ledger
from tasks.common import read_json, seed_for
from tasks.features import build_network, model_spec
from tasks.prepared import read_shape
from tasks.privacy.ledger import load_ledger
from tasks.projection import check_projection, load_projection

__all__ = ["FinetuneStart", "finetune_start"]


@dataclass
class FinetuneStart:
    ledger: Ledger
    records: Records
    projection: np.ndarray | None
    spec: ModelSpec  # the released model's architecture (finetune.model on records of the prepared shape)
    front: torch.nn.Sequential  # the frozen preprocessing (no parameters)
    features: np.ndarray  # the records through the front, computed once rather than every step

    @property
    def classes(self) -> int:
        """The task's label set: public (declared), never read off the labels."""
        return self.spec.classes

    @property
    def transform(self) -> torch.nn.Module | None:
        """The fixed feature transform (features.transform), the front's first layer."""
        return self.front[0] if self.spec.transform != "none" else None

    def network(self, params: Params, *, start: Path, dp_pca_dir: Path,
                log: logging.Logger | logging.LoggerAdapter) -> torch.nn.Module:
        """The student's trainable part when ``start`` holds one (checked against this DP-PCA), else fresh."""
        if (start / "model.pt").exists():
            check_projection(read_json(start / "model.json").get("dp_pca_digest", ""), dp_pca_dir,
                             source=start, rerun="student")
            log.info("finetune: starting from the student in %s", start)
            return load_released(start)[-1]  # the front is rebuilt when the model is released
        # seeded: the default run starts here (no student), and its weights must repeat for a seed
        seed = int(seed_for(params.run.seed, "finetune_init").generate_state(1)[0])
        return seeded(seed, lambda: build_network(self.spec, list(self.front)))


def finetune_start(params: Params, *, sensitive: Path, dp_pca_dir: Path, start: Path) -> FinetuneStart:
    cfg = params.finetune
    ledger = load_ledger(start / "ledger.json", params)
    records = Records.load(sensitive)
    projection = load_projection(dp_pca_dir)
    if cfg.model == "cnn" and projection is not None:
        raise ConfigError("finetune.model: cnn trains on raw pixels; set dp_pca.enabled: false")
    spec = model_spec(params, read_shape(Path(sensitive).parent), projection)
    front = torch.nn.Sequential(*spec.front(projection))
    return FinetuneStart(ledger=ledger, records=records, projection=projection, spec=spec, front=front,
                         features=apply_front(front, records.features))
