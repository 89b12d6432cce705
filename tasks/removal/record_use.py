"""Which records each stage's output trained on, as sets of hashed ids (the deletion queue's HMAC).

Each set says how it was used: ``dp`` (under the model's differential privacy), ``none``
(without any guarantee: PATE's public queries, the student's unlabeled pool, the head's own
rows), ``certified_removal`` / ``retrained`` (head rows a removal took out). The manifests that
carry these sets into the model registry, and the audit that reads them back, are in
:mod:`tasks.removal.coverage`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privpipe.config import Params
from privpipe.removal import Mechanism
from privpipe.requests import RequestQueue, hashes_in
from tasks.removal.scrub import erased_in, set_hashes
from tasks.removal.store import load_head, row_hashes

__all__ = ["RecordUse", "pipeline_uses", "text_uses", "head_uses", "extractor_uses"]


@dataclass(frozen=True)
class RecordUse:
    """One set of records a model version trained on, and how: ``dp``, ``none``, ``certified_removal``,
    ``retrained`` or ``unknown``; ``epsilon_tag``/``delta_tag`` name the version's tags that hold the guarantee."""

    name: str
    coverage: str
    detail: str
    hashes: frozenset[str] | None  # the records' hashed ids (None: not known)
    epsilon_tag: str | None = None
    delta_tag: str | None = None

    def holds(self, record_hash: str) -> bool:
        return self.hashes is not None and record_hash in self.hashes

    def to_json(self) -> dict[str, Any]:
        """As a manifest holds it (hashes sorted)."""
        return {"name": self.name, "coverage": self.coverage, "detail": self.detail, "epsilon_tag": self.epsilon_tag,
                "delta_tag": self.delta_tag, "hashes": None if self.hashes is None else sorted(self.hashes)}

    @classmethod
    def from_json(cls, use: dict[str, Any]) -> RecordUse:
        hashes = use.get("hashes")
        return cls(name=use["name"], coverage=use["coverage"], detail=use["detail"],
                   hashes=None if hashes is None else frozenset(hashes), epsilon_tag=use.get("epsilon_tag"),
                   delta_tag=use.get("delta_tag"))


def _use(name: str, coverage: str, hashes: Iterable[str] | None, detail: str, *,
         epsilon_tag: str | None = None, delta_tag: str | None = None) -> RecordUse:
    return RecordUse(name=name, coverage=coverage, detail=detail, hashes=None if hashes is None else frozenset(hashes),
                     epsilon_tag=epsilon_tag, delta_tag=delta_tag)


def _ids(folder: Path) -> np.ndarray:
    return np.load(Path(folder) / "ids.npy", allow_pickle=False)


def pipeline_uses(params: Params, queue: RequestQueue, *, prepared: Path,
                  epsilon_tag: str = "privacy.epsilon", delta_tag: str = "privacy.delta") -> list[RecordUse]:
    """The sets (under ``prepared``) the pipeline's deployed model trained on: the sensitive set under DP
    and, when PATE ran, the student's public queries and unlabeled pool without DP."""
    prepared = Path(prepared)
    uses = [_use("sensitive", "dp", set_hashes(queue, prepared / "sensitive"),
                 "in the DP-protected sensitive set", epsilon_tag=epsilon_tag, delta_tag=delta_tag)]
    if params.student.enabled:
        public = prepared / "public"
        # the first aggregate.queries records were asked; records scrubbed since (tasks.removal.scrub) may
        # have been: counted as asked (an erased record's coverage errs towards "not covered")
        ids = _ids(public)
        asked = ids[:min(params.aggregate.queries or len(ids), len(ids))]
        uses.append(_use("public_queries", "none", hashes_in(queue, asked) | erased_in(public),
                         "in the public pool: a PATE query the student trained on without DP"))
        target = prepared / "target"
        pool, what = (target, "the target-domain pool") if target.is_dir() else (public, "the public pool")
        uses.append(_use(f"{pool.name}_unlabeled", "none", set_hashes(queue, pool),
                         f"in {what}: unlabeled data the student trained on without DP"))
    return uses


def text_uses(queue: RequestQueue, *, private: bool, text_dir: Path) -> list[RecordUse]:
    """The federated text model's training texts: under its record-level DP, or with no guarantee
    at all when the run was not private (``federated.private: false``)."""
    ids = np.load(Path(text_dir) / "train_ids.npy", allow_pickle=False)
    # a text id is used whole (an ``id`` column may hold a colon; only the image sets' copies add suffixes)
    hashes = [queue.hash_record_id(str(i)) for i in ids]
    if not private:
        return [_use("text_train", "none", hashes, "in the federated training texts, trained on without DP")]
    return [_use("text_train", "dp", hashes,
                 "in the federated training texts (record-level DP: two add-or-remove steps of its client)",
                 epsilon_tag="privacy.record_epsilon", delta_tag="privacy.delta")]


def extractor_uses(params: Params, queue: RequestQueue, *, prepared: Path) -> list[RecordUse]:
    """What the head's feature extractor (``head.features``) trained on, for artifacts/<dataset>/head/extractor."""
    tags = {"epsilon_tag": "privacy.features_epsilon", "delta_tag": "privacy.features_delta"}
    if params.head.features == "model":
        uses = pipeline_uses(params, queue, prepared=prepared, **tags)
    elif params.head.features == "dp_pca":
        uses = [_use("sensitive", "dp", set_hashes(queue, Path(prepared) / "sensitive"),
                     "in the DP-protected sensitive set", **tags)]
    else:
        uses = []
    return [dataclasses.replace(use, name=f"extractor_{use.name}", detail=f"feature extractor: {use.detail}")
            for use in uses]


def head_uses(queue: RequestQueue, *, folder: Path) -> list[RecordUse]:
    """The head's rows as they stand (trained on, removed by Newton update, removed by retrain) and
    its extractor's sets (unknown for a head trained before extractors recorded them)."""
    head, ids, meta = load_head(folder)
    hashed = row_hashes(queue, ids)  # row by row, beside head.active
    # None: still in the head; a row removed before the head recorded how: a Newton update at least (a later
    # retrain is stronger still)
    how = [None if active else meta.removed_by.get(row, Mechanism.NEWTON) for row, active in enumerate(head.active)]
    uses = [
        _use("head_rows", "none", [h for h, w in zip(hashed, how) if w is None],
             "in the head's training rows: trained on without DP of its own (a removal takes it out)"),
        _use("head_removed_newton", "certified_removal", [h for h, w in zip(hashed, how) if w is Mechanism.NEWTON],
             "removed from the head by a Newton update (certified removal; the feature extractor by its DP)",
             epsilon_tag="certified_removal.epsilon", delta_tag="certified_removal.delta"),
        _use("head_removed_retrain", "retrained", [h for h, w in zip(hashed, how) if w is Mechanism.RETRAIN],
             "the head was retrained without it (exact); the feature extractor covers it by its DP",
             epsilon_tag="privacy.features_epsilon", delta_tag="privacy.features_delta"),
    ]
    recorded = Path(folder) / "extractor" / "record_use.json"
    if recorded.is_file():
        uses += [RecordUse.from_json(use) for use in json.loads(recorded.read_text())["uses"]]
    else:
        uses.append(_use("extractor", "unknown", None, "feature extractor trained before extractors recorded their "
                                                       "training data"))
    return uses
