"""Where each stage reads and writes, relative to the project folder (dvc.yaml names the same paths).

Every output belongs to one dataset and lives in that dataset's own folders, named as its lifetime
ledger is (:func:`dataset_name`: ``data/raw/digits.csv`` → ``digits``)::

    data/prepared/<dataset>/{sensitive,test,public,target,target_test}/, shape.json, identity.json
    artifacts/<dataset>/{dp_pca,partition,teachers,aggregate,student,finetune,head,private}/
    metrics/<dataset>/<stage>.json
    data/requests/<dataset>/          the deletion-request journal of that dataset

so several datasets run, retrain and erase in one project without touching each other. The
federated text flow keeps its corpus, features and model under ``artifacts/<text dataset>/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from privpipe.data import DataError

if TYPE_CHECKING:  # a type only: the paths stay importable without privpipe.config
    from privpipe.config import Params

__all__ = ["DatasetPaths", "TextPaths", "dataset_name", "for_params", "for_text", "all_journals",
           "PREPARED_ROOT", "ARTIFACTS_ROOT", "METRICS_ROOT", "REQUESTS_ROOT", "PIPELINE_LOCK", "TEXT_LOCK",
           "DEFAULT_DIGITS_CSV"]

PREPARED_ROOT = Path("data/prepared")
ARTIFACTS_ROOT = Path("artifacts")
METRICS_ROOT = Path("metrics")
REQUESTS_ROOT = Path("data/requests")
# held by `privpipe run` and by each `privpipe stage`: the project folder itself, so that a stage refused
# for bad input has created nothing
PIPELINE_LOCK = Path(".")
TEXT_LOCK = Path("artifacts/.federated-text.lock")  # held by `privpipe federated`
DEFAULT_DIGITS_CSV = Path("data/raw/digits.csv")
#: a dataset's name is a folder name in four places: letters, digits, '.', '_', '-' (not leading '.')
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
#: the journal's files, which before per-dataset folders lay in data/requests/ itself
_JOURNAL_FILES = ("queue.jsonl", "salt", "dvc-versions.json", "text-scrub.pending")


def dataset_name(params: Params, *, flow: str = "pipeline") -> str:
    """The dataset's name: its data file's (or folder's) name without suffix, e.g. ``digits``; it names the
    dataset's folders and its lifetime ledger. ``flow="federated-text"``: the text corpus's."""
    if flow == "federated-text":
        name, key = ("20newsgroups" if params.text.format == "20newsgroups" else Path(params.text.path).stem,
                     "text.path")
    else:
        name, key = Path(params.prepare.path).stem, "prepare.path"
    if not _NAME.fullmatch(name):
        raise DataError(f"{key}: the data's name {name!r} cannot name its folders (letters, digits, '.', '_' "
                        "and '-', not starting with '.'); rename the file or folder")
    return name


@dataclass(frozen=True)
class DatasetPaths:
    """The folders of one dataset's pipeline: its prepared sets, stage artifacts, metrics and journal, under
    ``root`` (the project folder; a benchmark's scratch folder)."""

    name: str
    root: Path = Path(".")

    @property
    def prepared(self) -> Path:
        return self.root / PREPARED_ROOT / self.name

    @property
    def sensitive(self) -> Path:
        return self.prepared / "sensitive"

    @property
    def test(self) -> Path:
        return self.prepared / "test"

    @property
    def public(self) -> Path:  # the student's query pool (source domain; labels kept only to score aggregation)
        return self.prepared / "public"

    @property
    def target(self) -> Path:  # unlabeled related-domain data for the student's association
        return self.prepared / "target"

    @property
    def target_test(self) -> Path:  # labeled related-domain data, for target accuracy only
        return self.prepared / "target_test"

    @property
    def artifacts(self) -> Path:
        return self.root / ARTIFACTS_ROOT / self.name

    @property
    def dp_pca(self) -> Path:
        return self.artifacts / "dp_pca"

    @property
    def partition(self) -> Path:
        return self.artifacts / "partition"

    @property
    def teachers(self) -> Path:
        return self.artifacts / "teachers"

    @property
    def teachers_partial(self) -> Path:  # each teacher's votes as it reports, until collect_votes stacks them
        return self.artifacts / "teachers.partial"

    @property
    def aggregate(self) -> Path:
        return self.artifacts / "aggregate"

    @property
    def student(self) -> Path:
        return self.artifacts / "student"

    @property
    def private(self) -> Path:  # data-dependent values that must not be published: not a DVC output
        return self.artifacts / "private"

    @property
    def finetune(self) -> Path:
        return self.artifacts / "finetune"

    @property
    def head(self) -> Path:  # the removal-enabled head: trained by the pipeline, updated by removal runs
        return self.artifacts / "head"

    @property
    def requests(self) -> Path:  # the deletion-request journal (append-only)
        return self.root / REQUESTS_ROOT / self.name

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_ROOT / self.name

    def metrics_file(self, stage: str) -> Path:
        return self.metrics / f"{stage}.json"

    def deployed(self, params: Params) -> Path:
        """The model this run deploys: the fine-tuned one, or the student when finetune is off."""
        return self.finetune if params.finetune.enabled else self.student


@dataclass(frozen=True)
class TextPaths:
    """The federated text flow's folders for one text corpus."""

    name: str

    @property
    def root(self) -> Path:
        return ARTIFACTS_ROOT / self.name

    @property
    def text(self) -> Path:  # the prepared corpus and client assignment
        return self.root / "text"

    @property
    def features(self) -> Path:  # embeddings (frozen encoder) or token ids (LoRA)
        return self.root / "text_features"

    @property
    def federated(self) -> Path:  # the federated text model, its history and ledger
        return self.root / "federated"

    @property
    def embedding_cache(self) -> Path:  # frozen-encoder embeddings, keyed by encoder and texts
        return self.root / "cache" / "embeddings"


def for_params(params: Params) -> DatasetPaths:
    """The folders of the dataset ``prepare.path`` names; DataError if a journal from before per-dataset
    folders lies in data/requests/ itself (its requests are never dropped: a person says whose they are)."""
    name = dataset_name(params)
    legacy = [f for f in _JOURNAL_FILES if (REQUESTS_ROOT / f).is_file()]
    if legacy:
        files = " ".join(str(REQUESTS_ROOT / f) for f in legacy)
        raise DataError(f"{REQUESTS_ROOT / legacy[0]}: a deletion journal from before each dataset had its own "
                        f"folder; move it to the dataset it served, e.g. `mkdir -p {REQUESTS_ROOT / name} && "
                        f"mv {files} {REQUESTS_ROOT / name}/` (nothing was changed)")
    return DatasetPaths(name)


def for_text(params: Params) -> TextPaths:
    return TextPaths(dataset_name(params, flow="federated-text"))


def all_journals() -> list[Path]:
    """Every dataset's journal folder in the project (a text corpus may be named by several params files:
    its flow leaves out a record requested in any of them)."""
    return sorted(p for p in REQUESTS_ROOT.glob("*/") if (p / "queue.jsonl").is_file()) \
        if REQUESTS_ROOT.is_dir() else []
