"""Where each stage reads and writes, relative to the project folder (dvc.yaml names the same paths)."""

from __future__ import annotations

from pathlib import Path

PREPARED = Path("data/prepared")
SENSITIVE = PREPARED / "sensitive"
TEST = PREPARED / "test"
DP_PCA = Path("artifacts/dp_pca")
FINETUNE = Path("artifacts/finetune")
METRICS = Path("metrics")
DEFAULT_DIGITS_CSV = Path("data/raw/digits.csv")


def metrics_file(stage: str) -> Path:
    return METRICS / f"{stage}.json"
