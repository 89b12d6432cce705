"""prepare: load the data, split it into the pipeline's sets, and store them.

    privpipe stage prepare        # what dvc repro runs

Sets (data/prepared/…): ``sensitive`` (the private training data: teachers, DP-PCA and
DP-SGD see it), ``public`` (the student's unlabeled query pool from the same domain),
``test``, and, with ``prepare.target_domain``, ``target`` (unlabeled data from a related
domain for the student's association) and ``target_test`` (labeled, to score it).

- Digits (default): the CSV under data/raw (written from scikit-learn's copy on first
  use), split into test, public, target and sensitive shares by a keyed hash of each
  record's id (:mod:`privpipe.data.split`): a record keeps its set in every data version,
  whatever else is erased. The target share goes through
  :func:`privpipe.data.domains.digits_target_transform`.
- MNIST: the four IDX files in ``prepare.path``. As in PATE, the train set is sensitive,
  the first ``prepare.public_queries`` test images are the public pool and the rest the
  test set: by file position, which erasure never shifts (IDX files are not rewritten;
  erased records are filtered here). The target domain is scikit-learn's UCI digits
  brought to 28×28, its labeled share picked by the same keyed hash.

Every record with an accepted deletion request is left out of every set: completed ones
(erased) and those still pending or in a removal batch (withheld: the request is the
owner's wish from the moment it is accepted, so no new model trains on the record).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.data import (
    DATASET_CLASSES,
    DataError,
    Records,
    check_labels,
    load_labeled_csv,
    load_mnist,
    split_by_shares,
    subsample,
)
from privpipe.data.domains import MNIST_BOX, MNIST_SIDE, as_mnist_canvas, digits_target_transform, uci_digits_as_mnist
from privpipe.data.image_sets import load_mnist_m, load_svhn, load_usps
from privpipe.data.mnist import mnist_files
from privpipe.requests import RequestQueue, base_id, version_suffix
from tasks import paths
from tasks.common import stage_logger, staged_dir
from tasks.prepared import PreparedSets
from tasks.source import ensure_default_data
from tasks.versioning import data_version

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.tracking import TrackedRun

__all__ = ["run_prepare", "prepare_task", "ensure_default_data", "prepared_sets", "Withheld"]


def _with_features(records: Records, features: np.ndarray, suffix: str) -> Records:
    return Records(features.astype(np.float32), records.labels, np.char.add(records.ids.astype(str), suffix))


def _load_digits(params: Params) -> tuple[dict[str, Records], list[Path]]:
    cfg, seed = params.prepare, params.run.seed
    source = Path(cfg.path)
    ensure_default_data(params)
    records = load_labeled_csv(source)
    check_labels(records, classes=DATASET_CLASSES["digits"], source=str(source))
    # each share is of the whole file; the target share is cut into its labeled and unlabeled parts
    shares = {"test": cfg.test_fraction, "public": cfg.public_fraction}
    if cfg.target_domain:
        shares["target"] = cfg.target_fraction * (1.0 - cfg.target_test_fraction)
        shares["target_test"] = cfg.target_fraction * cfg.target_test_fraction
    sets = split_by_shares(records, shares, rest="sensitive", seed=seed)
    for name in ("target", "target_test") if cfg.target_domain else ():
        # the copies keep the base id (plus ":target"): erasure and the set both follow the raw record
        sets[name] = _with_features(sets[name], digits_target_transform(sets[name].features), ":target")
    return sets, [source]


def _load_mnist(params: Params) -> tuple[dict[str, Records], list[Path]]:
    cfg = params.prepare
    source = Path(cfg.path)
    if cfg.download:
        source.mkdir(parents=True, exist_ok=True)  # torchvision fetches into it
    if not source.is_dir():
        raise DataError(f"prepare.path: {source} is not a folder of MNIST IDX files")
    splits = load_mnist(source, download=cfg.download)
    test = splits["test"]
    if cfg.public_queries >= len(test):
        raise ConfigError(f"prepare.public_queries: {cfg.public_queries} leaves no test images of {len(test)}")
    index = np.arange(len(test))
    sets = {"sensitive": splits["train"], "public": test.subset(index[:cfg.public_queries]),
            "test": test.subset(index[cfg.public_queries:])}
    if cfg.target_domain:
        sets["target"], sets["target_test"] = _mnist_target(params)
    return sets, mnist_files(source)


#: local target domains for MNIST: loader, image side, and the box the digit gets on the 28×28 canvas
_MNIST_TARGETS = {"usps": (load_usps, 16, MNIST_BOX), "svhn": (load_svhn, 32, MNIST_SIDE),
                  "mnist_m": (load_mnist_m, MNIST_SIDE, MNIST_SIDE)}


def _mnist_target(params: Params) -> tuple[Records, Records]:
    """(unlabeled target pool, labeled target test) for MNIST, in MNIST's 28×28 format."""
    cfg = params.prepare
    if cfg.target_source == "default":
        from sklearn.datasets import load_digits  # deferred: sklearn.datasets takes ~2 s

        uci = load_digits()  # ships with scikit-learn: no download
        ids = np.array([f"uci-digits-{i:04d}" for i in range(len(uci.target))])
        shifted = Records(uci_digits_as_mnist(uci.data), uci.target.astype(np.int64), ids)
        sets = split_by_shares(shifted, {"target_test": cfg.target_test_fraction}, rest="target", seed=params.run.seed)
        return sets["target"], sets["target_test"]
    loader, side, box = _MNIST_TARGETS[cfg.target_source]
    if cfg.target_path is None:  # config.prepare requires it for these sources; said here for the type checker
        raise ConfigError(f"prepare.target_path: must name the folder of the local {cfg.target_source} files")
    splits = loader(Path(cfg.target_path))  # their own train/test split: train is the unlabeled pool
    pool, test = (_with_features(splits[name], as_mnist_canvas(splits[name].features, side=side, box=box), "")
                  for name in ("train", "test"))
    return pool, test


@dataclass(frozen=True)
class Withheld:
    """The deletion requests prepare honoured: every request's hashed id, and those of the records
    the data actually held and prepare left out."""

    erased: set[str]  # requests done: erased from the data (the file may still hold them: IDX, an old version)
    pending: set[str]  # requests accepted but not done (pending, or in a removal batch)
    dropped_erased: set[str]  # of ``erased``, the records the file still held
    dropped_pending: set[str]  # of ``pending``, the records the file held


def _withhold(sets: dict[str, Records], queue: RequestQueue) -> tuple[dict[str, Records], Withheld]:
    """``sets`` less every record (or copy of one) with an accepted request: one journal read, and
    each record's id hashed once."""
    requests = queue.read()
    erased = {r.record_hash for r in requests if r.status == "done"}
    pending = {r.record_hash for r in requests} - erased
    if not requests:
        return sets, Withheld(set(), set(), set(), set())
    kept: dict[str, Records] = {}
    held: set[str] = set()
    for name, records in sets.items():
        hashes = [queue.hash_record_id(base_id(str(i))) for i in records.ids]
        drop = np.array([h in erased or h in pending for h in hashes], dtype=bool)
        held.update(h for h, d in zip(hashes, drop) if d)
        kept[name] = records if not drop.any() else records.subset(np.flatnonzero(~drop))
    return kept, Withheld(erased, pending, held & erased, held & pending)


def prepared_sets(params: Params) -> tuple[dict[str, Records], list[Path], Withheld]:
    """Every set the stage writes, loaded and checked, and nothing written (but the embedded
    default data on first use): (sets, source files, what was withheld for deletion requests).
    ``privpipe run`` calls it before Prefect starts, so bad data is refused before any run state exists."""
    sets, sources = (_load_digits if params.prepare.dataset == "digits" else _load_mnist)(params)
    # every accepted request, whatever its state: gone from every set, whatever the file says
    sets, withheld = _withhold(sets, RequestQueue(paths.REQUESTS))
    # after the drop, so erasing a record never moves another in or out (see subsample)
    sets["sensitive"] = subsample(sets["sensitive"], size=params.prepare.max_train_records, seed=params.run.seed)
    sensitive = sets["sensitive"]
    n = len(sensitive)
    if params.privacy.delta >= 1.0 / n:
        raise ConfigError(
            f"privacy.delta: {params.privacy.delta:g} is not below 1/n = {1.0 / n:.3g} (n = {n} sensitive records); "
            "a δ that large permits leaking a whole record"
        )
    for name, records in sets.items():
        check_labels(records, classes=DATASET_CLASSES[params.prepare.dataset], source=f"{sources[0]} ({name} set)")
    if len(set(sensitive.labels.tolist())) < 2:
        raise DataError(f"{sources[0]}: the sensitive set needs at least two classes")
    return sets, sources, withheld


def run_prepare(params: Params) -> PreparedSets:
    """Write data/prepared/* and metrics/prepare.json."""
    log = stage_logger("prepare")
    sets, sources, withheld = prepared_sets(params)
    sensitive = sets["sensitive"]
    with staged_dir(paths.PREPARED) as out:
        for name, records in sets.items():
            records.save(out / name)
    # the version names the data trained on: the file's, less what the queue took out of it
    version = data_version(sources)
    if withheld.dropped_erased:  # the file still holds records whose erasure is done (IDX files, or an old version)
        version += version_suffix("erased", withheld.dropped_erased)
    if withheld.dropped_pending:  # requests accepted, the file not yet rewritten
        version += version_suffix("pending", withheld.dropped_pending)
    prepared = PreparedSets(folder=paths.PREPARED, sizes={name: len(records) for name, records in sets.items()},
                            n_erased=len(withheld.erased), n_withheld_pending=len(withheld.pending),
                            n_features=int(sensitive.features.shape[1]),
                            n_classes=DATASET_CLASSES[params.prepare.dataset], data_version=version,
                            source=params.prepare.path)
    prepared.write_metrics()
    log.info("prepare: %s from %s (data version %s; %d records withheld for pending deletion requests)",
             ", ".join(f"{len(r)} {name}" for name, r in sets.items()), params.prepare.path, version,
             len(withheld.dropped_pending))
    return prepared


@task(name="prepare", cache_policy=NO_CACHE)
def prepare_task(params: Params, run: TrackedRun) -> PreparedSets:
    prepared = run_prepare(params)
    prepared.log(run)
    return prepared
