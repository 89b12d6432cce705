"""prepare: which data set, and how it is split into test, public, target-domain and sensitive records."""

from __future__ import annotations

from dataclasses import dataclass

from privpipe.config.errors import one_of, require

DATASETS = ("digits", "mnist")
TARGET_SOURCES = ("default", "usps", "svhn", "mnist_m")


@dataclass(frozen=True)
class PrepareConfig:
    dataset: str = "digits"  # ships with scikit-learn: the default run needs no download
    path: str = "data/raw/digits.csv"
    download: bool = False  # the pipeline is offline unless asked
    test_fraction: float = 0.2
    public_fraction: float = 0.1
    target_fraction: float = 0.15
    public_queries: int = 9000  # as in PATE: MNIST's first 9,000 test images are the public pool
    target_domain: bool = True
    target_source: str = "default"  # the one target domain that needs no local files
    target_path: str | None = None
    target_test_fraction: float = 0.3
    max_train_records: int = 0


def check(prepare: PrepareConfig) -> None:
    one_of(prepare.dataset, DATASETS, "prepare.dataset")
    require(0 < prepare.test_fraction < 1, "prepare.test_fraction", "must be in (0, 1)")
    require(prepare.max_train_records >= 0, "prepare.max_train_records", "must be >= 0")
    for key in ("public_fraction", "target_fraction", "target_test_fraction"):
        require(0 < getattr(prepare, key) < 1, f"prepare.{key}", "must be in (0, 1)")
    require(prepare.test_fraction + prepare.public_fraction + prepare.target_fraction < 1,
            "prepare.public_fraction", "test, public and target fractions leave no sensitive records")
    require(prepare.public_queries >= 1, "prepare.public_queries", "must be >= 1")
    one_of(prepare.target_source, TARGET_SOURCES, "prepare.target_source")
    if prepare.target_source != "default":
        require(prepare.dataset == "mnist", "prepare.target_source",
                f"{prepare.target_source} is a target domain for mnist (28×28); digits uses its own (default)")
        require(prepare.target_path is not None, "prepare.target_path",
                f"must name the folder of the local {prepare.target_source} files")
