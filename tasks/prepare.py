"""prepare: load the sensitive set and the test set, split, and store them.

    privpipe stage prepare        # what dvc repro runs

Digits (default): the CSV under data/raw (written from scikit-learn's copy on
first use), split into sensitive/test with a stratified, seeded split.
MNIST: the four IDX files in ``prepare.path``; its train set is sensitive.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.data import DataError, Records, export_digits_csv, load_labeled_csv, load_mnist, stratified_split, subsample
from privpipe.data.mnist import mnist_files
from tasks import paths
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


def _load(params: Params) -> tuple[Records, Records, list[Path]]:
    cfg = params.prepare
    source = Path(cfg.path)
    if cfg.dataset == "digits":
        ensure_default_data(params)
        records = load_labeled_csv(source)
        train, test = stratified_split(records, test_fraction=cfg.test_fraction, seed=params.run.seed)
        return train, test, [source]
    if cfg.download:
        source.mkdir(parents=True, exist_ok=True)  # torchvision fetches into it
    if not source.is_dir():
        raise DataError(f"prepare.path: {source} is not a folder of MNIST IDX files")
    splits = load_mnist(source, download=cfg.download)
    return splits["train"], splits["test"], mnist_files(source)


def run_prepare(params: Params) -> dict[str, str]:
    """Write data/prepared/{sensitive,test}; return their paths and the data version."""
    log = stage_logger("prepare")
    train, test, sources = _load(params)
    train = subsample(train, size=params.prepare.max_train_records, seed=params.run.seed)
    n = len(train)
    if params.privacy.delta >= 1.0 / n:
        raise ConfigError(
            f"privacy.delta: {params.privacy.delta:g} is not below 1/n = {1.0 / n:.3g} (n = {n} sensitive records); "
            "a δ that large permits leaking a whole record"
        )
    if len(set(train.labels.tolist())) < 2:
        raise DataError(f"{sources[0]}: the sensitive set needs at least two classes")
    with staged_dir(paths.PREPARED) as out:
        train.save(out / paths.SENSITIVE.name)
        test.save(out / paths.TEST.name)
    version = data_version(sources)
    summary = {"n_sensitive": n, "n_test": len(test), "n_features": int(train.features.shape[1]),
               "n_classes": int(max(train.labels.max(), test.labels.max()) + 1), "data_version": version}
    write_json(paths.metrics_file("prepare"), summary)
    log.info("prepare: %d sensitive and %d test records from %s (data version %s)", n, len(test),
             params.prepare.path, version)
    return {"sensitive": str(paths.SENSITIVE), "test": str(paths.TEST), **{k: str(v) for k, v in summary.items()}}


@task(name="prepare", cache_policy=NO_CACHE)
def prepare_task(params: Params, run_id: str) -> dict[str, str]:
    from tasks import tracking

    out = run_prepare(params)
    tracking.log_prepare(params, run_id, out)
    return out
