"""prepare: which data set, read how, and how it is split into test, public, target-domain and sensitive records.

The kinds (``dataset``), each read from local files in its standard format:

- ``digits``: scikit-learn's digits (the embedded default), as a CSV under data/raw;
- ``mnist``: the four IDX files; ``cifar10``: the extracted ``cifar-10-batches-py`` folder; ``svhn``: the
  ``*_32x32.mat`` files. Each has its own test set: its first ``public_queries`` images are the public pool;
- ``csv``: a table (CSV, or Parquet by suffix) with an id column, a label column and feature columns,
  described by ``schema`` (the public label set and each column's bounds, scale or categories);
- ``imagefolder``: torchvision's layout, one sub-folder of PNG/JPEG images per class.

Without a test file of its own (``test_path``), a data set is split by keyed per-record draws into the
test, public and target shares and the sensitive rest. ``public_path`` and ``target_path`` name unlabeled
files of the same kind instead of shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.choices import Choice, Variant, fixed
from privpipe.config.data_schema import DataSchema
from privpipe.config.errors import one_of, require
from privpipe.config.ranges import MAX_COUNT, Range, at_least, fraction


@dataclass(frozen=True, kw_only=True)
class DataKind(Variant):
    """A data kind's properties, which every check and stage reads instead of its name."""

    #: its records are images (else a table: an id, a label and feature columns, and maybe a client column)
    images: bool = fixed(True)
    #: it ships a test set of its own, whose first public_queries images are the public pool
    own_test_set: bool = fixed(False)
    #: its label set is its own (else declared in prepare.schema, or discovered with DP)
    own_classes: bool = fixed(False)
    #: images: the channels it is stored with (prepare.channels may change them where resizable)
    channels: int = fixed(3)
    #: images: the side its images have as stored (None: whatever the files hold)
    side: int | None = fixed(None)
    #: images: whether prepare.image_size and prepare.channels may change its size and colour
    resizable: bool = fixed(True)
    #: whether test_path and public_path may name files of its kind (else its one file is split by shares)
    extra_files: bool = fixed(True)
    #: whether prepare.target_source may name another domain's files (usps, svhn, mnist_m: 28×28 grey digits)
    target_sources: bool = fixed(False)
    #: whether the pipeline's defaults are tuned for it (else a recipe is fitted to the data: tasks/recipe.py)
    tuned_defaults: bool = fixed(False)
    #: whether it ships with privpipe (written on first run, no file of the user's)
    embedded: bool = fixed(False)


#: prepare.dataset: each kind, read from local files in its standard format by its class (privpipe.data.sources)
DATA_KINDS: Choice[DataKind] = Choice("prepare.dataset", [
    DataKind(tag="digits", implementation="privpipe.data.sources:Digits", own_classes=True, channels=1, side=8,
             resizable=False, extra_files=False, tuned_defaults=True, embedded=True),
    DataKind(tag="mnist", implementation="privpipe.data.sources:Mnist", own_test_set=True, own_classes=True,
             channels=1, side=28, resizable=False, target_sources=True, tuned_defaults=True),
    DataKind(tag="csv", implementation="privpipe.data.sources:Table", images=False),
    DataKind(tag="imagefolder", implementation="privpipe.data.sources:ImageFolder"),
    DataKind(tag="cifar10", implementation="privpipe.data.sources:Cifar10", own_test_set=True, own_classes=True,
             side=32),
    DataKind(tag="svhn", implementation="privpipe.data.sources:Svhn", own_test_set=True, own_classes=True, side=32),
])
TARGET_SOURCES = ("default", "usps", "svhn", "mnist_m")


@dataclass(frozen=True)
class PrepareConfig:
    #: the kind of data: digits (ships with scikit-learn) | mnist (IDX files) | csv (a CSV or Parquet table) |
    #: imagefolder (class sub-folders of PNG/JPEG) | cifar10 (python batches) | svhn (.mat files)
    dataset: str = "digits"  # ships with scikit-learn: the default run needs no download
    #: the data: digits: the CSV exported on first run; mnist: the folder of the 4 IDX .gz files; csv: the table (a CSV
    #: or Parquet file, or a folder of Parquet parts, whose parts a flow run maps on the runner);
    #: imagefolder: the folder of class sub-folders; cifar10: cifar-10-batches-py; svhn: the folder of the .mat files
    path: str = "data/raw/digits.csv"
    #: mnist, cifar10: let torchvision download the files into prepare.path if they are not there (never by default)
    download: bool = False  # the pipeline is offline unless asked
    #: csv: the column holding each record's id, what a deletion request names
    id_column: str = "id"
    #: csv: the column holding each record's label (words or integers)
    label_column: str = "label"
    #: csv: the feature columns; null = every column but the id, label and client
    feature_columns: tuple[str, ...] | None = None
    #: what is public about the data (labels; each column's bounds, scale or categories), never computed from the
    #: rows; what it leaves out (csv: any of it; images: labels) the schema stage discovers with DP, charged to the run
    schema: DataSchema | None = None
    #: images: resize every image to this side (null: as stored, all one size)
    image_size: int | None = None
    #: images: 1 (grey) or 3 (colour); null: the kind's own (mnist, digits 1; others 3)
    channels: int | None = None
    #: a labeled test set of the same kind, instead of a test share
    test_path: str | None = None
    #: an unlabeled public pool of the same kind, instead of a public share
    public_path: str | None = None
    #: kinds without their own test set (digits, csv, imagefolder): the held-out share (a keyed per-record draw: a
    #: record keeps its set in every data version); mnist, cifar10 and svhn keep their own test set
    test_fraction: float = 0.2
    #: kinds without their own test set: the share kept as the public pool (the student's queries, unlabeled)
    public_fraction: float = 0.1
    #: kinds without their own test set: the share held out to derive the target domain (see target_domain)
    target_fraction: float = 0.15
    #: mnist, cifar10, svhn: the first N test images are the public pool, the rest the test set (as in PATE)
    public_queries: int = 9000  # as in PATE: MNIST's first 9,000 test images are the public pool
    #: make a related-domain set for the student: digits → a fixed transform of held-out digits; mnist → UCI digits at
    #: 28×28
    target_domain: bool = True
    #: mnist only: default (UCI digits) | usps | svhn | mnist_m (local files, see target_path)
    target_source: str = "default"  # the one target domain that needs no local files
    #: folder of the usps (usps.bz2, usps.t.bz2), svhn (*_32x32.mat) or mnist_m files
    target_path: str | None = None
    #: share of the target domain kept labeled, only to measure target accuracy (default sources)
    target_test_fraction: float = 0.3
    #: 0 = all; otherwise the records with the smallest keyed draw (stable under erasure; quick trials)
    max_train_records: int = 0

    @property
    def kind(self) -> DataKind:
        """``dataset``'s properties."""
        return DATA_KINDS[self.dataset]

    @property
    def images(self) -> bool:
        return self.kind.images

    @property
    def own_test_set(self) -> bool:
        """Whether the test set comes from a file (the kind's own, or ``test_path``), not a share."""
        return self.kind.own_test_set or self.test_path is not None

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {
        "image_size": at_least(4, 4096), "channels": at_least(1, 3), "test_fraction": fraction(),
        "public_fraction": fraction(zero=True), "target_fraction": fraction(zero=True),
        "public_queries": at_least(1, MAX_COUNT), "target_test_fraction": fraction(zero=True),
        "max_train_records": at_least(0, MAX_COUNT),
    }


def check(prepare: PrepareConfig) -> None:
    DATA_KINDS.check(prepare.dataset)
    kind = prepare.kind
    require(0 < prepare.test_fraction < 1, "prepare.test_fraction", "must be in (0, 1)")
    require(prepare.max_train_records >= 0, "prepare.max_train_records", "must be >= 0")
    for key in ("public_fraction", "target_fraction", "target_test_fraction"):
        require(0 < getattr(prepare, key) < 1, f"prepare.{key}", "must be in (0, 1)")
    require(prepare.test_fraction + prepare.public_fraction + prepare.target_fraction < 1,
            "prepare.public_fraction", "test, public and target fractions leave no sensitive records")
    require(prepare.public_queries >= 1, "prepare.public_queries", "must be >= 1")
    one_of(prepare.target_source, TARGET_SOURCES, "prepare.target_source")
    if prepare.target_source != "default":
        takers = " or ".join(k.tag for k in DATA_KINDS if k.target_sources)
        require(kind.target_sources, "prepare.target_source",
                f"{prepare.target_source} is a target domain for {takers} (28×28); {prepare.dataset} uses its own "
                "(default)")
        require(prepare.target_path is not None, "prepare.target_path",
                f"must name the folder of the local {prepare.target_source} files")
    if not kind.images:
        require(prepare.id_column != prepare.label_column, "prepare.label_column",
                f"is the id column too ({prepare.id_column!r})")
        named = set(prepare.feature_columns or ())
        for key in ("id_column", "label_column"):
            require(getattr(prepare, key) not in named, "prepare.feature_columns",
                    f"lists the {key.replace('_', ' ')} {getattr(prepare, key)!r}")
        for key in ("image_size", "channels"):
            require(getattr(prepare, key) is None, f"prepare.{key}", f"is for image data, not {prepare.dataset}")
    else:
        tables = " or ".join(k.tag for k in DATA_KINDS if not k.images)
        require(prepare.feature_columns is None, "prepare.feature_columns", f"is for {tables} data, not "
                                                                          f"{prepare.dataset}")
        if prepare.schema is not None:
            require(not prepare.schema.columns, "prepare.schema.columns",
                    f"describes table columns; {prepare.dataset} has images (only schema.labels applies)")
        require(prepare.image_size is None or prepare.image_size >= 4, "prepare.image_size",
                "must be >= 4 (pixels a side)")
        require(prepare.channels in (None, 1, 3), "prepare.channels", "must be 1 (grey) or 3 (colour)")
        require(kind.resizable or prepare.image_size is None, "prepare.image_size",
                f"{prepare.dataset} keeps its own size (use imagefolder for resized copies)")
        require(kind.resizable or prepare.channels in (None, kind.channels), "prepare.channels",
                f"{prepare.dataset} images are grey (1 channel)")
    require(kind.extra_files or (prepare.test_path is None and prepare.public_path is None),
            "prepare.test_path", f"{prepare.dataset} splits its one file by keyed shares (test_path and public_path "
                                 "are for your own data)")
    require(prepare.test_path is None or not kind.own_test_set, "prepare.test_path",
            f"{prepare.dataset} has its own test set")
