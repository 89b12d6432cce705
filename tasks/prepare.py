"""prepare: load the data, split it into the pipeline's sets, and store them.

    privpipe stage prepare        # what dvc repro runs

Sets (data/prepared/…): ``sensitive`` (the private training data: teachers, DP-PCA and
DP-SGD see it), ``public`` (the student's unlabeled query pool from the same domain),
``test``, and, with ``prepare.target_domain``, ``target`` (unlabeled data from a related
domain for the student's association) and ``target_test`` (labeled, to score it).

- Digits (default): the CSV under data/raw (written from scikit-learn's copy on first
  use), split stratified and seeded into test, public, target and sensitive shares; the
  target share goes through :func:`privpipe.data.domains.digits_target_transform`.
- MNIST: the four IDX files in ``prepare.path``. As in PATE, the train set is sensitive,
  the first ``prepare.public_queries`` test images are the public pool and the rest the
  test set; the target domain is scikit-learn's UCI digits brought to 28×28.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.data import (DATASET_CLASSES, DataError, Records, check_labels, export_digits_csv, load_labeled_csv,
                           load_mnist, stratified_split, subsample)
from privpipe.data.domains import MNIST_BOX, MNIST_SIDE, as_mnist_canvas, digits_target_transform, uci_digits_as_mnist
from privpipe.data.image_sets import load_mnist_m, load_svhn, load_usps
from privpipe.data.mnist import mnist_files
from privpipe.requests import RequestQueue
from tasks import paths
from tasks.erase import drop_erased
from tasks.common import stage_logger, staged_dir, write_json
from tasks.versioning import data_version

__all__ = ["run_prepare", "prepare_task", "ensure_default_data"]


def ensure_default_data(params: Params) -> bool:
    """Write the embedded default (digits CSV) if params use it and it is missing; True if written.

    The bytes are deterministic, so they match the md5 in data/raw/digits.csv.dvc.
    """
    source = Path(params.prepare.path)
    if params.prepare.dataset == "digits" and source == paths.DEFAULT_DIGITS_CSV and not source.exists():
        export_digits_csv(source)
        return True
    return False


def _split_off(records: Records, share: float, seed: int) -> tuple[Records, Records]:
    """(rest, the split-off share of ``records``), stratified."""
    return stratified_split(records, test_fraction=share, seed=seed)


def _with_features(records: Records, features: np.ndarray, suffix: str) -> Records:
    return Records(features.astype(np.float32), records.labels, np.char.add(records.ids.astype(str), suffix))


def _load_digits(params: Params) -> tuple[dict[str, Records], list[Path]]:
    cfg, seed = params.prepare, params.run.seed
    source = Path(cfg.path)
    ensure_default_data(params)
    records = load_labeled_csv(source)
    # before the stratified split, which fails on a stray label with a message naming no file
    check_labels(records, classes=DATASET_CLASSES["digits"], source=str(source))
    rest, test = _split_off(records, cfg.test_fraction, seed)
    # later shares are of what is left, so each is the stated share of the whole file
    left = 1.0 - cfg.test_fraction
    rest, public = _split_off(rest, cfg.public_fraction / left, seed)
    left -= cfg.public_fraction
    sets = {"test": test, "public": public}
    if cfg.target_domain:
        rest, held_out = _split_off(rest, cfg.target_fraction / left, seed)
        shifted = _with_features(held_out, digits_target_transform(held_out.features), ":target")
        sets["target"], sets["target_test"] = _split_off(shifted, cfg.target_test_fraction, seed)
    sets["sensitive"] = rest
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
    index = list(range(len(test)))
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
        from sklearn.datasets import load_digits

        uci = load_digits()  # ships with scikit-learn: no download
        ids = np.array([f"uci-digits-{i:04d}" for i in range(len(uci.target))])
        shifted = Records(uci_digits_as_mnist(uci.data), uci.target.astype(np.int64), ids)
        return _split_off(shifted, cfg.target_test_fraction, params.run.seed)
    loader, side, box = _MNIST_TARGETS[cfg.target_source]
    splits = loader(Path(cfg.target_path))  # their own train/test split: train is the unlabeled pool
    return tuple(_with_features(splits[name], as_mnist_canvas(splits[name].features, side=side, box=box), "")
                 for name in ("train", "test"))


def prepared_sets(params: Params) -> tuple[dict[str, Records], list[Path], set[str], int]:
    """Every set the stage writes, loaded and checked, and nothing written (but the embedded
    default data on first use): (sets, source files, erased record hashes, records dropped as erased).
    ``privpipe run`` calls it before Prefect starts, so bad data is refused before any run state exists."""
    sets, sources = (_load_digits if params.prepare.dataset == "digits" else _load_mnist)(params)
    queue = RequestQueue(paths.REQUESTS)
    erased = queue.erased_record_hashes()  # completed deletion requests: gone from every set, whatever the file says
    before = sum(len(records) for records in sets.values())
    sets = {name: drop_erased(records, queue, erased) for name, records in sets.items()}
    filtered = before - sum(len(records) for records in sets.values())
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
    return sets, sources, erased, filtered


def run_prepare(params: Params) -> dict[str, str]:
    """Write data/prepared/*; return their paths and the data version."""
    log = stage_logger("prepare")
    sets, sources, erased, filtered = prepared_sets(params)
    sensitive = sets["sensitive"]
    with staged_dir(paths.PREPARED) as out:
        for name, records in sets.items():
            records.save(out / name)
    version = data_version(sources)
    if filtered:  # the file still holds records whose erasure is done (IDX files, or an old version checked out)
        version = f"{version}+minus-erased:{len(erased)}"
    summary = {f"n_{name}": len(records) for name, records in sets.items()}
    summary["n_erased"] = len(erased)
    summary.update({"n_features": int(sensitive.features.shape[1]), "data_version": version,
                    "n_classes": DATASET_CLASSES[params.prepare.dataset]})
    write_json(paths.metrics_file("prepare"), summary)
    log.info("prepare: %s from %s (data version %s)",
             ", ".join(f"{len(r)} {name}" for name, r in sets.items()), params.prepare.path, version)
    out = {name: str(paths.PREPARED / name) for name in sets}
    return {**out, **{k: str(v) for k, v in summary.items()}}


@task(name="prepare", cache_policy=NO_CACHE)
def prepare_task(params: Params, run_id: str) -> dict[str, str]:
    from tasks import tracking

    out = run_prepare(params)
    tracking.log_prepare(params, run_id, out)
    return out
