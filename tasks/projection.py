"""The DP-PCA release as the later stages read it: :class:`Projection`, the dp_pca stage's output, and
its file format (artifacts/<dataset>/dp_pca/{projection.npy, ledger.json}).

Kept apart from the stage itself (tasks/dp_pca.py), so that the teachers, the student, finetune and the
head depend on the format of the release, not on the code that makes it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from privpipe.data import DataError
from privpipe.privacy import Ledger
from tasks.common import read_json, write_json
from tasks.paths import DatasetPaths

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.tracking import TrackedRun

__all__ = ["Projection", "load_projection", "projection_digest", "check_projection"]

STAGE = "dp_pca"


@dataclass(frozen=True)
class Projection:
    """The dp_pca stage's output: the released projection (none when the stage is off) and the run's
    ledger so far, under ``where.dp_pca``."""

    where: DatasetPaths
    enabled: bool
    noise_multiplier: float | None  # σ of the noise on AᵀA (None when off)
    epsilon: float  # the stage's ε alone (0 when off)

    @property
    def dir(self) -> Path:
        return self.where.dp_pca

    @property
    def ledger_file(self) -> Path:
        return self.dir / "ledger.json"

    @property
    def projection_file(self) -> Path | None:
        return self.dir / "projection.npy" if self.enabled else None

    def ledger(self) -> Ledger:
        return Ledger.from_json(self.ledger_file.read_text())

    def metrics(self) -> dict[str, bool | float | None]:
        """metrics/dp_pca.json."""
        return {"enabled": self.enabled, "noise_multiplier": self.noise_multiplier, "epsilon": self.epsilon}

    def write_metrics(self) -> None:
        write_json(self.where.metrics_file(STAGE), self.metrics())

    @classmethod
    def read(cls, where: DatasetPaths) -> Projection:
        """The last run's output, from its metrics file (what ``privpipe stage evaluate --track`` records)."""
        figures = read_json(where.metrics_file(STAGE))
        return cls(where=where, enabled=figures["enabled"], noise_multiplier=figures["noise_multiplier"],
                   epsilon=figures["epsilon"])

    def log(self, run: TrackedRun) -> None:
        """MLflow: σ as a tag, the run's privacy so far (the ledger starts here)."""
        if self.noise_multiplier is not None:
            run.log_figures({"dp_pca.noise_multiplier": self.noise_multiplier})
        run.log_privacy(self.ledger())


def load_projection(dp_pca_dir: Path) -> np.ndarray | None:
    """The released projection, or None when DP-PCA was off."""
    file = Path(dp_pca_dir) / "projection.npy"
    return np.load(file) if file.exists() else None


def projection_digest(dp_pca_dir: Path) -> str:
    """Identifies the DP-PCA release a later stage built on (its ledger accounts for exactly one)."""
    file = Path(dp_pca_dir) / "projection.npy"
    return hashlib.sha256(file.read_bytes()).hexdigest() if file.exists() else "none"


def check_projection(recorded: str, dp_pca_dir: Path, *, source: Path, rerun: str) -> None:
    """Refuse to mix outputs built on different DP-PCA releases: the ledger would count one of two."""
    if recorded != projection_digest(dp_pca_dir):
        raise DataError(f"{source}: built on another DP-PCA projection than {dp_pca_dir}; re-run the {rerun} stage")
