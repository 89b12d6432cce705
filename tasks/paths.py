"""Where each stage reads and writes, relative to the project folder (dvc.yaml names the same paths)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: the paths stay importable without privpipe.config
    from privpipe.config import Params

PREPARED = Path("data/prepared")
SENSITIVE = PREPARED / "sensitive"
TEST = PREPARED / "test"
PUBLIC = PREPARED / "public"  # the student's query pool (source domain; labels kept only to score aggregation)
TARGET = PREPARED / "target"  # unlabeled related-domain data for the student's association
TARGET_TEST = PREPARED / "target_test"  # labeled related-domain data, for target accuracy only
DP_PCA = Path("artifacts/dp_pca")
PARTITION = Path("artifacts/partition")
TEACHERS = Path("artifacts/teachers")
AGGREGATE = Path("artifacts/aggregate")
STUDENT = Path("artifacts/student")
PRIVATE = Path("artifacts/private")  # data-dependent values that must not be published: not a DVC output
FINETUNE = Path("artifacts/finetune")
HEAD = Path("artifacts/head")  # the removal-enabled head: trained by the pipeline, updated by removal runs
REQUESTS = Path("data/requests")  # the deletion-request journal (append-only)
TEXT = Path("artifacts/text")  # the federated text flow's prepared corpus and client assignment
TEXT_FEATURES = Path("artifacts/text_features")  # embeddings (frozen encoder) or token ids (LoRA)
FEDERATED = Path("artifacts/federated")  # the federated text model, its history and ledger
EMBEDDING_CACHE = Path("artifacts/cache/embeddings")  # frozen-encoder embeddings, keyed by encoder and texts
METRICS = Path("metrics")
# held by `privpipe run` and by each `privpipe stage`: the project folder itself, so that a stage refused
# for bad input has created nothing
PIPELINE_LOCK = Path(".")
TEXT_LOCK = Path("artifacts/.federated-text.lock")  # held by `privpipe federated`
DEFAULT_DIGITS_CSV = Path("data/raw/digits.csv")


def metrics_file(stage: str) -> Path:
    return METRICS / f"{stage}.json"


def deployed_dir(params: Params) -> Path:
    """The model this run deploys: the fine-tuned one, or the student when finetune is off."""
    return FINETUNE if params.finetune.enabled else STUDENT
