"""The raw data's old versions in DVC's cache: the copies of erased records that removal runs make.

Every batch that rewrites a DVC-tracked raw file ``dvc add``s the new version
(:func:`tasks.removal.erase.erase_from_source`), and the version before stays in ``.dvc/cache``
(DVC 3's layout: ``files/md5/<first 2 hex>/<other 30>``): with the batch's records, and in every
older version the records of the batches after it too. After each erasure (and on a
``privpipe removals`` with nothing pending) :func:`prune_versions` takes each version of such a file
that privpipe knows of, other than the current one:

- the versions removal runs replaced (:data:`LEDGER`, written before each ``dvc add``), those the
  done requests' audit records name (a single raw file: its md5 is the data version), and those
  the registered model versions' ``dvc.data_version`` tags name;

and, when its bytes (in the cache, or in a remote that is a folder here) hold an erased record:

- no registered model version that is not differentially private was trained on it: deleted from
  ``.dvc/cache`` and from every DVC remote that is a folder on this machine (the project's
  ``.dvcstore``); recorded in the ledger first, so the audit records keep naming it, and a run killed
  in between deletes it when run again. A DP model version (the pipeline's released model, a private
  text model) stays valid without its raw training data: its (ε, δ) covers the erased record. Such
  versions trained on a deleted copy are listed in the audit record
  (``erasure.copies.dvc_cache.unreproducible``) and tagged ``dvc.reproducible = false``: their
  training data version can no longer be checked out;
- a registered version that is not DP was (the removal-enabled head: its versions are flagged for
  deletion by the coverage audit; its ``dvc.data_version``, less what prepare withheld): kept, listed by
  md5 in the audit record (``erasure.copies.dvc_cache.kept``) with the model versions that need it.
  Delete those versions and the next ``privpipe removals`` deletes it.

The current version is never deleted, nor any output ``dvc.lock`` records. A remote that is not a
folder here (S3, SSH, …) is not touched: the audit record names the object to delete from it.
Nothing else is looked at: versions from before privpipe recorded any (the pointer's git history)
are not known here; ``dvc gc`` removes what no commit needs.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from privpipe.config import Params, redact_url
from privpipe.data import DataError
from privpipe.data.tabular import id_text, read_table
from privpipe.requests import RequestQueue
from tasks import paths
from tasks.common import write_json
from tasks.run_view import resolve_tracking_uri
from tasks.versioning import MD5_PATTERN, DvcRemote, combined_version, dvc_remotes, pointer_md5

if TYPE_CHECKING:  # MLflow only when a removal run prunes: tasks.removal.erase (and `privpipe forget`) import this
    from mlflow.tracking import MlflowClient

__all__ = ["LEDGER_FILE", "ledger_file", "CachePrune", "cache_object", "remember_replaced", "remember_sets",
           "prune_versions", "REPRODUCIBLE_TAG"]

LEDGER_FILE = "dvc-versions.json"  # beside the journal: versions replaced, sets seen, versions deleted
CACHE = Path(".dvc/cache")
REPRODUCIBLE_TAG = "dvc.reproducible"  # "false" on a DP model version whose raw training data was deleted


def ledger_file(params: Params) -> Path:
    """The dataset's record of its raw data's versions, beside its deletion journal."""
    return paths.for_params(params).requests / LEDGER_FILE


def cache_object(root: Path, md5: str) -> Path:
    """Where DVC 3 keeps a file's bytes of that md5 under a cache or a local remote."""
    return root / "files" / "md5" / md5[:2] / md5[2:]


@dataclass
class _VersionLedger:
    """What removal runs recorded of the raw data's versions (``path``, :data:`LEDGER_FILE`): each file's
    replaced md5s, the md5 sets of multi-file data, and the md5s deleted (→ their file)."""

    path: Path
    replaced: dict[str, list[str]] = field(default_factory=dict)
    sets: list[list[list[str]]] = field(default_factory=list)
    deleted: dict[str, str] = field(default_factory=dict)

    def save(self) -> None:
        write_json(self.path, {"replaced": self.replaced, "sets": self.sets, "deleted": self.deleted})


def _ledger(path: Path) -> _VersionLedger:
    data = json.loads(path.read_text()) if path.is_file() else {}
    return _VersionLedger(path=path, replaced=data.get("replaced", {}), sets=data.get("sets", []),
                          deleted=data.get("deleted", {}))


def remember_replaced(ledger_path: Path, file: Path, md5: str | None) -> None:
    """Record that ``file``'s version ``md5`` is about to be replaced by a ``dvc add`` (before it: idempotent)."""
    if md5 is None:
        return
    ledger = _ledger(ledger_path)
    known = ledger.replaced.setdefault(str(file), [])
    if md5 not in known:
        known.append(md5)
        ledger.save()


def remember_sets(ledger_path: Path, sets: Iterable[list[tuple[str, str]]]) -> None:
    """Record versions of a raw data set of several files (each file's md5, in the source's order), so a
    model tagged with the set's label (``untracked:<digest of the md5s>``) names the files' versions."""
    ledger = _ledger(ledger_path)
    new = [[list(pair) for pair in s] for s in sets if len(s) > 1]
    new = [s for i, s in enumerate(new) if s not in ledger.sets and s not in new[:i]]
    if new:
        ledger.sets += new
        ledger.save()


def _file_version(label: str) -> str:
    """A data version label's file version: what prepare withheld (``+minus-…``) taken off."""
    return label.partition("+")[0]


def _model_versions(client: MlflowClient) -> list[Any]:
    out, token = [], None
    while True:
        page = client.search_model_versions(page_token=token)
        out += list(page)
        token = page.token
        if not token:
            return out


def _differentially_private(tags: dict[str, str]) -> bool:
    """Whether a registered version's guarantee is DP (a finite ε of its own), so that it needs no copy of its
    raw training data to stay valid; the head (``privacy.head_dp = false``) and a non-private model do."""
    if tags.get("privacy.head_dp") == "false":
        return False
    try:
        return math.isfinite(float(tags.get("privacy.epsilon", "inf")))
    except ValueError:
        return False


@dataclass(frozen=True)
class _Users:
    """The registered versions trained on each raw data version (md5), by whether they need it to stay valid."""

    needed: dict[str, list[str]]  # md5 → versions that are not DP: the copy is kept while they exist
    dp: dict[str, list[str]]  # md5 → DP versions: the copy may go; they are then marked unreproducible
    unknown: list[str]  # versions with no dvc.data_version tag


def _users(client: MlflowClient, sets: list[list[list[str]]]) -> _Users:
    """Each md5's registered model versions, the DP ones apart; and the versions whose training data version
    is unknown (no ``dvc.data_version`` tag)."""
    needed: dict[str, list[str]] = {}
    dp: dict[str, list[str]] = {}
    unknown = []
    for mv in _model_versions(client):
        name = f"{mv.name}/{mv.version}"
        label = mv.tags.get("dvc.data_version")
        if label in (None, "", "unknown"):
            # a removal run tags its version with the data version after its batch once the erasure is done:
            # the current one, never deleted
            if "removal.batch_id" not in mv.tags:
                unknown.append(name)
            continue
        base = _file_version(label)
        kind, _, digest = base.rpartition(":")
        md5s = ([digest] if kind in ("", "modified") and MD5_PATTERN.fullmatch(digest) else
                [md5 for s in sets if combined_version([md5 for _, md5 in s]) == base for _, md5 in s])
        users = dp if _differentially_private(dict(mv.tags)) else needed
        for md5 in dict.fromkeys(md5s):
            users.setdefault(md5, []).append(name)
    return _Users(needed=needed, dp=dp, unknown=unknown)


def _remotes() -> list[DvcRemote]:
    """DVC's remotes, their URLs with any secret in them redacted (the audit record names them)."""
    return [dataclasses.replace(r, url=str(redact_url(r.url))) for r in dvc_remotes()]


def _mark_unreproducible(client: MlflowClient, versions: list[str], md5: str) -> None:
    for version in versions:
        name, _, number = version.rpartition("/")
        client.set_model_version_tag(name, number, REPRODUCIBLE_TAG, "false")
        client.set_model_version_tag(name, number, "dvc.data_version_deleted",
                                     f"{md5}: held an erased record; deleted from the DVC cache and folder remotes")


def _ids(obj: Path, file: Path, id_column: str) -> list[str] | None:
    """The record ids in a cached version of ``file``, read as prepare reads ``file`` (its suffix names the
    format); None when its bytes are not such a table."""
    try:
        table = read_table(obj, suffix=file.suffix)
    except (DataError, csv.Error):
        return None
    if id_column not in table.names:
        return None
    return [id_text(v) for v in table.cells[id_column]]


@dataclass
class CachePrune:
    """What became of the raw data's cached versions that hold an erased record (``erasure.copies.dvc_cache``)."""

    files: list[str]
    deleted: list[dict[str, str]] = field(default_factory=list)  # now or by an earlier run
    kept: list[dict[str, Any]] = field(default_factory=list)
    remotes: list[dict[str, Any]] = field(default_factory=list)
    unknown_data_version: list[str] = field(default_factory=list)
    # DP model versions whose training data version was deleted: valid (their DP covers the erased
    # records), no longer reproducible from DVC
    unreproducible: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None
    deleted_now: int = 0  # versions this call deleted (the log's count; the audit lists every one deleted)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cache": str(CACHE), "files": self.files, "deleted": self.deleted,
                               "kept": self.kept, "remotes": self.remotes, "unreproducible": self.unreproducible}
        if self.unknown_data_version:
            out["unknown_data_version"] = self.unknown_data_version
        if self.note is not None:
            out["note"] = self.note
        return out


def _protected(pointers: list[Path]) -> set[str]:
    """The md5s that must stay: each tracked raw file's current version, and every output dvc.lock records."""
    keep = {md5 for p in pointers if (md5 := pointer_md5(p)) is not None}
    lock = Path("dvc.lock")
    if lock.is_file():
        try:
            stages = (yaml.safe_load(lock.read_text()) or {}).get("stages") or {}
        except yaml.YAMLError:
            stages = {}
        for stage in stages.values():
            keep |= {str(out.get("md5", "")).removesuffix(".dir") for out in stage.get("outs") or []}
    return keep


def _candidates(files: list[Path], ledger: _VersionLedger, queue: RequestQueue,
                needed: dict[str, list[str]]) -> dict[str, set[str]]:
    """md5 → the raw files it may be a version of."""
    found: dict[str, set[str]] = {}
    for file in files:
        for md5 in ledger.replaced.get(str(file), []):
            found.setdefault(md5, set()).add(str(file))
        for s in ledger.sets:
            for name, md5 in s:
                if name == str(file):
                    found.setdefault(md5, set()).add(name)
    if len(files) == 1:  # one raw file: its md5 is the data version the audits and the models' tags name
        labels = [r.audit.get(key, "") for r in queue.read() if r.status == "done" and r.audit
                  for key in ("data_version_before", "data_version_after")]
        for label in labels:
            digest = _file_version(str(label)).rpartition(":")[2]
            if MD5_PATTERN.fullmatch(digest):
                found.setdefault(digest, set()).add(str(files[0]))
        for md5 in needed:
            found.setdefault(md5, set()).add(str(files[0]))
    return found


def prune_versions(params: Params, pointers: list[Path], queue: RequestQueue, erased: set[str]) -> CachePrune:
    """Delete the versions of the DVC-tracked raw files (``pointers``) that hold a record of ``erased``
    (hashed ids) and that no registered model version needs; list those one does. Safe to repeat."""
    files = [p.with_name(p.name.removesuffix(".dvc")) for p in pointers if pointer_md5(p) is not None]
    out = CachePrune(files=[str(f) for f in files])
    if not files:
        if pointers:
            out.note = ("an image folder: an erasure deletes the images and makes no new copy; the cache keeps the "
                        "objects it held before (`dvc gc --workspace` once no commit needs them)")
        return out
    ledger = _ledger(ledger_file(params))
    if not erased and not ledger.deleted:
        return out
    remotes = _remotes()
    # deferred: MLflow's client loads only when a removal run prunes (not for `privpipe forget`)
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    registry_read = True
    try:
        client = MlflowClient(tracking_uri=resolve_tracking_uri(params.run.tracking_uri))
        users = _users(client, ledger.sets)
        needed, out.unknown_data_version = users.needed, users.unknown
    except (MlflowException, OSError) as error:
        users, needed, registry_read = _Users({}, {}, []), {}, False
        out.note = (f"the model registry could not be read ({type(error).__name__}): no version was deleted; "
                    "the next `privpipe removals` tries again")
    protected = _protected(pointers)
    id_column = "id" if params.prepare.images else params.prepare.id_column
    candidates = _candidates(files, ledger, queue, {**users.dp, **needed})
    for md5, names in sorted(candidates.items()):
        if md5 in protected:
            continue
        file = Path(sorted(names)[0])
        copies = [p for p in [cache_object(CACHE, md5), *(cache_object(r.folder, md5) for r in remotes if r.folder)]
                  if p.is_file()]
        if not copies:
            continue
        ids = _ids(copies[0], file, id_column)
        if ids is None or not any(queue.hash_record_id(i) in erased for i in ids):
            continue  # not a version of the table, or one without an erased record
        if md5 in needed or not registry_read:
            holders = needed.get(md5, [])
            out.kept.append({"file": str(file), "md5": md5, "copies": [str(p) for p in copies],
                             "needed_by": holders,
                             "why": (f"the training data (dvc.data_version) of registered model version(s) "
                                     f"{', '.join(holders)} that are not DP: delete them (coverage says what "
                                     "each holds) and the next `privpipe removals` deletes this version"
                                     if holders else
                                     "the model registry could not be read")})
            continue
        if ledger.deleted.get(md5) != str(file):
            ledger.deleted[md5] = str(file)  # first: a run killed before the unlinks keeps naming it
            ledger.save()
        for copy in copies:
            copy.unlink(missing_ok=True)
        out.deleted_now += 1
    for md5 in sorted(ledger.deleted):  # now and before: a run killed before its tags tags them when run again
        versions = users.dp.get(md5, [])
        if versions:
            _mark_unreproducible(client, versions, md5)
            out.unreproducible.append({
                "file": ledger.deleted[md5], "md5": md5, "model_versions": versions,
                "why": "DP model version(s) trained on this data version, which held an erased record: their (ε, δ) "
                       "covers it, so they stay valid, but their training data can no longer be checked out "
                       f"(tagged {REPRODUCIBLE_TAG} = false)"})
    gone = {md5: file for md5, file in ledger.deleted.items()
            if not any(cache_object(root, md5).is_file() for root in [CACHE, *(r.folder for r in remotes if r.folder)])}
    out.deleted = [{"file": file, "md5": md5} for md5, file in sorted(gone.items())]
    for remote in remotes:
        if remote.folder is not None:
            out.remotes.append({"name": remote.name, "url": remote.url, "folder": True,
                                "cleaned": "versions deleted here were deleted from it too",
                                "holds_kept": [k["md5"] for k in out.kept
                                               if cache_object(remote.folder, k["md5"]).is_file()]})
        else:
            out.remotes.append({"name": remote.name, "url": remote.url, "folder": False,
                                "cleaned": "not reached from here: delete each deleted version's object (objects, "
                                           "under the url) with the remote's own tools; `dvc gc --cloud` deletes "
                                           "every version the workspace does not use, the kept ones too",
                                "objects": [f"files/md5/{md5[:2]}/{md5[2:]}" for md5 in sorted(gone)]})
    return out
