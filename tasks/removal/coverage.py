"""Which records each registered model version trained on, and how each is covered for a deletion.

Every version registered from now on carries a *manifest*: the artifact
``record_use/<name>-v<version>.json`` of its run (named by the version's tag
``privacy.record_manifest``), listing the hashed ids (the deletion queue's HMAC) of every set
of records the version trained on and how it used them:

- ``dp``: under the version's differential privacy (the DP model's sensitive set; the text
  model's training texts, at their record-level ε; the head's feature extractor);
- ``none``: without any guarantee (the public pool's PATE queries and the unlabeled pool the
  student trained on; the head's own training rows, until a removal takes them out);
- ``certified_removal`` / ``retrained``: head rows a removal took out, by a Newton update since
  the head's last training, or by a retrain without them.

For a request the coverage of a version is ``not_covered`` if any ``none`` set holds the
record, else the strongest of ``retrained``, ``certified_removal``, ``dp`` that does, else
``unknown`` where part of the version's data is not known (no manifest: registered before
manifests existed), else ``not_trained_on``. Each covered entry carries its (ε, δ), read from
the version's tags that the manifest names.
"""

from __future__ import annotations

import functools
import json
import logging
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privpipe.config import Params
from privpipe.requests import Request, RequestQueue
from tasks import paths
from tasks.removal.record_use import RecordUse, pipeline_uses, text_uses
from tasks.removal.store import head_model_name

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.tracking import MlflowClient

    from tasks.tracking import TrackedRun

__all__ = ["MANIFEST_TAG", "log_manifest", "version_uses", "requested_since_data", "ErasedDuringRun", "coverage_audit",
           "flag_uncovered", "UncoveredVersion", "Coverage", "ACTIONS", "UNCOVERED"]

MANIFEST_TAG = "privacy.record_manifest"
FORMAT = "privpipe.record_use/1"
UNCOVERED = ("not_covered", "unknown")
#: what the operator should do with a version that does not cover a request, by model kind
ACTIONS = {
    "model": "retrain without the record(s) (`privpipe run`: prepare leaves every requested record out), "
             "then delete this version",
    "text": "retrain without the record(s) (`privpipe federated`: prepare leaves every requested record out), "
            "then delete this version",
    "head": "delete this version: it still holds the record(s), and a later head version has them removed",
    "unknown": "registered before record manifests, so whether it trained on the record(s) is unknown: "
               "retrain, then delete this version",
}
_STRENGTH = ("retrained", "certified_removal", "dp")  # strongest first

log = logging.getLogger("privpipe.record_use")


def log_manifest(run: TrackedRun, name: str, version: str, *, kind: str, uses: Sequence[RecordUse]) -> str:
    """Log a version's manifest to ``run`` and tag the version with the artifact's path; safe to repeat."""
    path = f"record_use/{name}-v{version}.json"
    manifest = {"format": FORMAT, "model": name, "version": str(version), "kind": kind,
                "uses": [use.to_json() for use in uses]}
    run.log_text(json.dumps(manifest, separators=(",", ":")), path)
    run.client.set_model_version_tag(name, str(version), MANIFEST_TAG, path)
    return path


def version_uses(params: Params, run: TrackedRun) -> tuple[str, list[RecordUse]] | None:
    """(kind, uses) of the model ``run`` is about to register: the federated text flow's or the
    pipeline's deployed model, told apart by the run's flow tag; None where its data is not on disk."""
    text = run.tags().get("privpipe.flow") == "federated-text"
    where, text_dir = paths.for_params(params), paths.for_text(params).text
    needed = text_dir / "train_ids.npy" if text else where.sensitive / "ids.npy"
    if not needed.is_file():  # a model registered outside a run of the stages: its coverage will read "unknown"
        log.warning("record manifest of the model of run %s: %s is missing; erasure audits will report the "
                    "version as of unknown training data", run.run_id, needed)
        return None
    queue = RequestQueue(where.requests)
    if text:
        return "text", text_uses(queue, private=params.federated.private, text_dir=text_dir)
    return "model", pipeline_uses(params, queue, prepared=where.prepared)


class ErasedDuringRun(RuntimeError):
    """A model would be registered that used, without any guarantee, a record whose deletion was
    requested (or done) after its run read the data: refused."""


def requested_since_data(uses: Sequence[RecordUse], *, model: str, queue: RequestQueue) -> dict[str, str]:
    """At registration: the deletion requests accepted since the run read its data (any record of its
    training sets has one: prepare leaves out every record requested before) against the version's sets.
    Raises ErasedDuringRun where a set used without any guarantee holds one; else the tags that record
    that the version predates those erasures and what covers each record (its DP, or a removal)."""
    requested = queue.withheld_record_hashes()
    hit = {use.name: (use, hashes) for use in uses if use.hashes and (hashes := requested & use.hashes)}
    plain = {name: len(hashes) for name, (use, hashes) in hit.items() if use.coverage == "none"}
    if plain:
        sets = ", ".join(f"{n} in {name}" for name, n in plain.items())
        raise ErasedDuringRun(f"{model}: not registered: {sum(plain.values())} record(s) whose deletion was "
                              f"requested while this run went on were used without any guarantee ({sets}); run "
                              "again: prepare leaves them out")
    if not hit:
        return {}
    records = len(set().union(*(hashes for _use, hashes in hit.values())))
    covered = "; ".join(f"{len(hashes)} in {name}: {use.coverage}" for name, (use, hashes) in hit.items())
    return {"privacy.erasure.requested_since_data": str(records),
            "privacy.erasure.note": f"trained on data read before the deletion of {records} of its records was "
                                    f"requested; they are not removed but covered ({covered}); a retrain "
                                    "leaves them out"}


# -- the audit of a batch ---------------------------------------------------------------------------


def _model_names(params: Params) -> dict[str, str]:
    return {params.run.model_name: "model", head_model_name(params): "head", params.text.model_name: "text"}


@dataclass(frozen=True)
class Manifest:
    """A registered version's record manifest, read back: its kind and the sets it trained on."""

    kind: str  # model | head | text
    uses: list[RecordUse]


def _manifest(client: MlflowClient, version: ModelVersion, folder: Path) -> Manifest | None:
    path = version.tags.get(MANIFEST_TAG)
    if not path or not version.run_id:
        return None
    local = client.download_artifacts(version.run_id, path, str(folder))
    manifest = json.loads(Path(local).read_text())
    return Manifest(kind=manifest["kind"], uses=[RecordUse.from_json(use) for use in manifest["uses"]])


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Coverage:
    """How one registered version covers one record: ``not_covered``, ``unknown``, ``not_trained_on`` or the
    guarantee that does (``retrained``, ``certified_removal``, ``dp``, with its (ε, δ) from the version's tags)."""

    model: str
    version: str
    kind: str
    coverage: str
    detail: str
    use: str | None = None  # the set that decided it
    epsilon: float | None = None
    delta: float | None = None

    def to_json(self) -> dict[str, Any]:
        """As the audit record holds it (only the fields that say something)."""
        out: dict[str, Any] = {"model": self.model, "version": self.version, "kind": self.kind,
                               "coverage": self.coverage}
        if self.use is not None:
            out["use"] = self.use
        out["detail"] = self.detail
        if self.coverage in _STRENGTH:
            out.update(epsilon=self.epsilon, delta=self.delta)
        return out


def _coverage(record_hash: str, manifest: Manifest | None, tags: Mapping[str, str], *, model: str, version: str,
              kind: str) -> Coverage:
    entry = functools.partial(Coverage, model=model, version=version, kind=manifest.kind if manifest else kind)
    if manifest is None:
        return entry(coverage="unknown", detail="registered before record manifests: its training data is unknown")
    held = [u for u in manifest.uses if u.holds(record_hash)]
    plain = [u for u in held if u.coverage == "none"]
    if plain:
        return entry(coverage="not_covered", use=plain[0].name, detail=plain[0].detail)
    for strength in _STRENGTH:
        match = next((u for u in held if u.coverage == strength), None)
        if match is not None:
            return entry(coverage=strength, use=match.name, detail=match.detail,
                         epsilon=_number(tags.get(match.epsilon_tag or "")),
                         delta=_number(tags.get(match.delta_tag or "")))
    unknown = next((u for u in manifest.uses if u.coverage == "unknown"), None)
    if unknown is not None:
        return entry(coverage="unknown", use=unknown.name, detail=unknown.detail)
    return entry(coverage="not_trained_on", detail="not in this version's training data")


def _action(entry: Coverage) -> str:
    """The ACTIONS key for an uncovered entry: an old head version that still holds the row is
    superseded by the removal's; anything else trained on the record needs a retrain."""
    if entry.coverage == "unknown":
        return "unknown"
    if entry.use == "head_rows":
        return "head"
    return "model" if entry.kind == "head" else entry.kind


def coverage_audit(params: Params, client: MlflowClient, requests: Sequence[Request]) -> dict[str, list[Coverage]]:
    """Per request: every registered version of the run's models (DP model, head, text model), each
    with how it covers the record (versions registered earlier count even where this params file
    registers none)."""
    out: dict[str, list[Coverage]] = {r.request_id: [] for r in requests}
    with tempfile.TemporaryDirectory(prefix="privpipe-manifests-") as folder:
        for name, kind in _model_names(params).items():
            versions = sorted(client.search_model_versions(f"name = '{name}'"), key=lambda v: int(v.version))
            for version in versions:
                manifest = _manifest(client, version, Path(folder) / f"{name}-{version.version}")
                for request in requests:
                    out[request.request_id].append(_coverage(request.record_hash, manifest, version.tags, model=name,
                                                             version=str(version.version), kind=kind))
    return out


@dataclass(frozen=True)
class UncoveredVersion:
    """A registered version that does not cover some deletion requests, and what the operator should do."""

    model: str
    version: str
    requests: list[str]  # every request it does not cover
    in_batch: list[str]  # those of the batch just processed
    action: str  # one of ACTIONS


def flag_uncovered(client: MlflowClient, coverage: Mapping[str, Sequence[Coverage]],
                   batch: Iterable[str]) -> list[UncoveredVersion]:
    """Tag every registered version that does not cover some request (``privacy.erasure.*``); return
    them, each with its requests (``requests``: all, ``in_batch``: those of ``batch``) and what to do.

    ``coverage`` is :func:`coverage_audit` of every request done so far and the batch's, computed
    afresh against the versions registered now (manifests do not change): a version registered
    after a request was done (a later head version on the same extractor) is caught, a version
    deleted since is not listed, and a re-run after a crash tags the same.
    """
    batch = set(batch)
    requests: dict[tuple[str, str], set[str]] = {}
    kinds: dict[tuple[str, str], str] = {}
    rank = ("head", "text", "model", "unknown")  # the later one's action also settles the earlier ones'
    for request_id, entries in coverage.items():
        for entry in entries:
            if entry.coverage in UNCOVERED:
                key = (entry.model, entry.version)
                requests.setdefault(key, set()).add(request_id)
                kinds[key] = max(kinds.get(key, "head"), _action(entry), key=rank.index)
    flagged = []
    for key in sorted(requests, key=lambda k: (k[0], int(k[1]))):
        action = ACTIONS[kinds[key]]
        tags = {"privacy.erasure.uncovered_requests": str(len(requests[key])), "privacy.erasure.action": action,
                "privacy.erasure.retrain_needed": str(kinds[key] != "head").lower()}
        for tag, value in tags.items():
            client.set_model_version_tag(key[0], key[1], tag, value)
        flagged.append(UncoveredVersion(model=key[0], version=key[1], requests=sorted(requests[key]),
                                        in_batch=sorted(requests[key] & batch), action=action))
    return flagged
