"""Where the pipeline's records come from: one class per data kind (``prepare.dataset``), chosen by name.

    source = data_source("csv")
    loaded = source.load(params.prepare, seed=0, client_column=None)
    loaded.sets["sensitive"], loaded.shape, loaded.files

Each kind reads its standard local format and returns the sets prepare stores: ``sensitive`` (the
private training records), ``test``, ``public`` (the unlabeled query pool of PATE's student; its labels,
where a share has them, only score the aggregation) and, where there is one, ``target`` (unlabeled
data of a related domain) with ``target_test``. Kinds with a test set of their own (MNIST, CIFAR-10,
SVHN) keep it: their first ``public_queries`` test records are the public pool, as in PATE. The others
are split by keyed per-record draws (privpipe.data.split), so a record keeps its set in every data
version; ``test_path``, ``public_path`` and ``target_path`` name files of the same kind instead.

A kind also says which record ids exist (what a deletion request may name), which files a data
version hashes, and how an erasure reaches the raw data: a table is rewritten without the rows, an
image folder loses the files; positional ids (IDX files, CIFAR-10's batches, SVHN's .mat) are never
rewritten, since a rewrite would shift every later id onto another record: there the erasure is
prepare's filter alone, on every run.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import numpy as np

from privpipe.config.errors import ConfigError
from privpipe.config.prepare import DATA_KINDS, DataKind, PrepareConfig
from privpipe.data.columnar import (
    encode_table_batches,
    erase_rows,
    feature_names,
    file_ids,
    table_batches,
    table_header,
    table_parts,
)
from privpipe.data.digits import labeled_csv_features, load_labeled_csv
from privpipe.data.domains import (
    MNIST_BOX,
    MNIST_SIDE,
    as_mnist_canvas,
    digits_target_transform,
    uci_digits_as_mnist,
)
from privpipe.data.image_sets import load_mnist_m, load_svhn, load_usps
from privpipe.data.images import (
    IMAGE_SUFFIXES,
    ImageFolderFiles,
    image_batches,
    image_files,
    image_folder_files,
    load_cifar10,
)
from privpipe.data.mnist import load_mnist, mnist_files, read_idx
from privpipe.data.partitioned import PartMapper, PartSpec, encode_split, merge_parts, part_jobs
from privpipe.data.raw_input import ImageInput, RecordInput, TableInput, VectorInput
from privpipe.data.records import DataError, Records, check_labels
from privpipe.data.shape import DataShape
from privpipe.data.sink import IdIndex, SetSink
from privpipe.data.split import split_by_shares
from privpipe.data.tabular import read_table, write_table

__all__ = ["LoadedData", "DataSource", "data_source"]

DIGIT_CLASSES = tuple(str(d) for d in range(10))


@dataclass(frozen=True)
class LoadedData:
    """What a kind read: the sets (by name), the records' shape, the raw files a data version hashes, and the
    rule a raw record of the kind is encoded by (what a served model applies to a team's own records)."""

    sets: dict[str, Records]
    shape: DataShape
    files: list[Path]
    rule: RecordInput


def _image_rule(shape: DataShape, resize: str, *, native: int | None = None) -> ImageInput:
    return ImageInput(channels=shape.channels, height=shape.height, width=shape.side, resize=resize, native=native)


def _with_features(records: Records, features: np.ndarray, suffix: str) -> Records:
    """A copy of ``records`` with other features; its ids keep the base id (plus ``suffix``): erasure and the
    set both follow the raw record."""
    return Records(features.astype(np.float32), records.labels, np.char.add(records.ids.astype(str), suffix))


def _unique_across(files: list[tuple[str, np.ndarray]]) -> None:
    """Refuse an id in two of the user's files (each named, with its ids): a deletion request names one record."""
    owner: dict[str, str] = {}
    for source, ids in files:
        for record_id in ids.astype(str).tolist():
            if record_id in owner and owner[record_id] != source:
                raise DataError(f"{source}: record id {record_id!r} is also in {owner[record_id]} (ids must name one "
                                "record across the data set's files)")
            owner.setdefault(record_id, source)


def _into(sink: SetSink | None, sets: dict[str, Records]) -> dict[str, Records]:
    """A kind that holds its sets in memory: them, or (given a sink) them written to it."""
    if sink is None:
        return sets
    sink.add_all(sets)
    return sink.close()


class DataSource(ABC):
    """One data kind: how its records are read, split, named and erased. Its properties (images? a test set of
    its own?) are its :class:`~privpipe.config.prepare.DataKind`, the line of privpipe.config.prepare.DATA_KINDS
    that names this class."""

    def __init__(self, kind: DataKind) -> None:
        self.kind = kind

    @property
    def name(self) -> str:
        return self.kind.tag

    #: whether an erasure rewrites the raw data (else: prepare leaves erased records out on every run)
    rewritable: ClassVar[bool] = False

    @abstractmethod
    def load(self, cfg: PrepareConfig, *, seed: int, client_column: str | None = None,
             sink: SetSink | None = None, map_parts: PartMapper | None = None) -> LoadedData:
        """Every set, checked (labels in the label set, one shape); given a ``sink``, each set is written to it
        as it is read (a kind that reads in batches holds one batch in memory), else held in memory. ``map_parts``:
        where a partitioned table's parts are encoded (privpipe.data.partitioned; other kinds read in turn)."""

    @abstractmethod
    def record_ids(self, cfg: PrepareConfig) -> list[str]:
        """Every id a deletion request may name, erased or not (cheap: no pixel is decoded)."""

    @abstractmethod
    def files(self, cfg: PrepareConfig) -> list[Path]:
        """The raw files a data version hashes (and a rewrite replaces)."""

    def training_ids(self, cfg: PrepareConfig) -> list[str]:
        """The ids of the records training is drawn from: ``prepare.path``'s (a kind with a test set of its
        own: its training split), not test_path's, public_path's or target_path's."""
        return self.record_ids(replace(cfg, test_path=None, public_path=None, target_path=None))

    def training_count(self, cfg: PrepareConfig) -> int:
        """How many records :meth:`training_ids` names (a kind that can count them without listing them does)."""
        return len(self.training_ids(cfg))

    def erase(self, cfg: PrepareConfig, drop: Callable[[str], bool]) -> int:
        """Remove the records whose id ``drop`` picks from the raw data; how many went. Only kinds whose ids do
        not shift (``rewritable``)."""
        raise NotImplementedError(f"{self.name}: record ids are positions; an erasure is prepare's filter alone")


def _shares(cfg: PrepareConfig, *, test: bool, public: bool, target: bool) -> dict[str, float]:
    """The keyed shares of the main file: those of the sets no other file gives."""
    shares = {}
    if test:
        shares["test"] = cfg.test_fraction
    if public:
        shares["public"] = cfg.public_fraction
    if target:  # cut into its unlabeled pool and its labeled part (which scores the domain adaptation)
        shares["target"] = cfg.target_fraction * (1.0 - cfg.target_test_fraction)
        shares["target_test"] = cfg.target_fraction * cfg.target_test_fraction
    return shares


class Digits(DataSource):
    """scikit-learn's digits, as the CSV ``id,label,p0..p63`` (the embedded default). Its target domain is a
    fixed restyling of held-out digits (privpipe.data.domains)."""

    rewritable = True

    def load(self, cfg: PrepareConfig, *, seed: int, client_column: str | None = None,
             sink: SetSink | None = None, map_parts: PartMapper | None = None) -> LoadedData:
        source = Path(cfg.path)
        records = load_labeled_csv(source)
        check_labels(records, classes=10, source=str(source))
        sets = split_by_shares(records, _shares(cfg, test=True, public=True, target=cfg.target_domain),
                               rest="sensitive", seed=seed)
        for name in ("target", "target_test") if cfg.target_domain else ():
            sets[name] = _with_features(sets[name], digits_target_transform(sets[name].features), ":target")
        return LoadedData(_into(sink, sets), DataShape.image(channels=1, height=8, width=8,
                                                             classes=_classes(cfg, DIGIT_CLASSES)),
                          [source], VectorInput(columns=labeled_csv_features(source)))

    def record_ids(self, cfg: PrepareConfig) -> list[str]:
        return [str(i) for i in load_labeled_csv(Path(cfg.path)).ids]

    def files(self, cfg: PrepareConfig) -> list[Path]:
        return [Path(cfg.path)]

    def erase(self, cfg: PrepareConfig, drop: Callable[[str], bool]) -> int:
        table = read_table(Path(cfg.path))
        keep = np.array([not drop(str(i)) for i in table.cells["id"]], dtype=bool)
        if not keep.all():
            write_table(table, keep)
        return int((~keep).sum())


def _classes(cfg: PrepareConfig, own: tuple[str, ...]) -> tuple[str, ...]:
    """The kind's label set, or the schema's names for it (which must be as many)."""
    if cfg.schema is None or cfg.schema.labels is None:  # their classes are public: nothing to discover
        return own
    if len(cfg.schema.labels) != len(own):
        raise ConfigError(f"prepare.schema.labels: {cfg.dataset} has {len(own)} classes, the schema names "
                          f"{len(cfg.schema.labels)}")
    return cfg.schema.labels


def _fixed_test_sets(cfg: PrepareConfig, train: Records, test: Records) -> dict[str, Records]:
    """A kind with its own test set: train is sensitive; the first ``public_queries`` test records are the public
    pool (by position, which erasure never shifts), the rest the test set; or the pool is ``public_path``."""
    if cfg.public_path is not None:
        return {"sensitive": train, "test": test}
    if cfg.public_queries >= len(test):
        raise ConfigError(f"prepare.public_queries: {cfg.public_queries} leaves no test images of {len(test)}")
    index = np.arange(len(test))
    return {"sensitive": train, "public": test.subset(index[:cfg.public_queries]),
            "test": test.subset(index[cfg.public_queries:])}


#: local target domains for MNIST: loader, image side, and the box the digit gets on the 28×28 canvas
_MNIST_TARGETS = {"usps": (load_usps, 16, MNIST_BOX), "svhn": (load_svhn, 32, MNIST_SIDE),
                  "mnist_m": (load_mnist_m, MNIST_SIDE, MNIST_SIDE)}


class Mnist(DataSource):
    """MNIST's four IDX files. Its target domain: the UCI digits at 28×28, or local USPS, SVHN or MNIST-M."""


    def load(self, cfg: PrepareConfig, *, seed: int, client_column: str | None = None,
             sink: SetSink | None = None, map_parts: PartMapper | None = None) -> LoadedData:
        source = Path(cfg.path)
        if cfg.download:
            source.mkdir(parents=True, exist_ok=True)  # torchvision fetches into it
        if not source.is_dir():
            raise DataError(f"prepare.path: {source} is not a folder of MNIST IDX files")
        splits = load_mnist(source, download=cfg.download)
        sets = _fixed_test_sets(cfg, splits["train"], splits["test"])
        if cfg.target_domain:
            sets["target"], sets["target_test"] = self._target(cfg, seed)
        shape = DataShape.image(channels=1, height=28, width=28, classes=_classes(cfg, DIGIT_CLASSES))
        return LoadedData(_into(sink, sets), shape, mnist_files(source), _image_rule(shape, "pillow"))

    @staticmethod
    def _target(cfg: PrepareConfig, seed: int) -> tuple[Records, Records]:
        """(unlabeled target pool, labeled target test) in MNIST's 28×28 format."""
        if cfg.target_source == "default":
            from sklearn.datasets import load_digits  # deferred: sklearn.datasets takes ~2 s

            uci = load_digits()  # ships with scikit-learn: no download
            ids = np.array([f"uci-digits-{i:04d}" for i in range(len(uci.target))])
            shifted = Records(uci_digits_as_mnist(uci.data), uci.target.astype(np.int64), ids)
            sets = split_by_shares(shifted, {"target_test": cfg.target_test_fraction}, rest="target", seed=seed)
            return sets["target"], sets["target_test"]
        loader, side, box = _MNIST_TARGETS[cfg.target_source]
        if cfg.target_path is None:  # config.prepare requires it for these sources
            raise ConfigError(f"prepare.target_path: must name the folder of the local {cfg.target_source} files")
        splits = loader(Path(cfg.target_path))  # their own train/test split: train is the unlabeled pool
        pool, test = (_with_features(splits[name], as_mnist_canvas(splits[name].features, side=side, box=box), "")
                      for name in ("train", "test"))
        return pool, test

    def record_ids(self, cfg: PrepareConfig) -> list[str]:
        ids = []  # from the labels files alone: counts, not pixels
        for split, labels in (("train", "train-labels"), ("test", "t10k-labels")):
            file = next((f for f in mnist_files(Path(cfg.path)) if f.name.startswith(labels)), None)
            count = len(read_idx(file)) if file is not None else 0
            ids += [f"mnist-{split}-{i:05d}" for i in range(count)]
        return ids

    def files(self, cfg: PrepareConfig) -> list[Path]:
        return mnist_files(Path(cfg.path))


def _pool_folders(cfg: PrepareConfig) -> list[tuple[str, ImageFolderFiles]]:
    """The unlabeled image folders the user names for the public pool and the target domain (any depth)."""
    return [(name, image_folder_files(Path(path), labeled=False))
            for name, path in (("public", cfg.public_path), ("target", cfg.target_path))
            if path is not None and (name == "public" or cfg.target_domain)]


def _image_pools(cfg: PrepareConfig, shape: DataShape, sink: SetSink,
                 pools: list[tuple[str, ImageFolderFiles]] | None = None) -> None:
    """Image kinds other than MNIST and digits: the public pool and the target domain from folders the user names
    (unlabeled images), of the data set's size (``image_size`` resizes them too), a batch at a time."""
    for name, folder in _pool_folders(cfg) if pools is None else pools:
        for records, image in image_batches(folder, channels=shape.channels, size=cfg.image_size):
            if image != shape.image_shape:
                raise DataError(f"prepare.{name}_path: {folder.root} holds {image[1]}×{image[2]} images with "
                                f"{image[0]} channel(s), the data set {shape.describe()} (set prepare.image_size)")
            sink.add(name, _prefixed(records, folder.root))


def _prefixed(records: Records, root: Path) -> Records:
    """Ids as paths under the folder's parent (``train/cat/0042.png``): two folders of one data set (train and
    test) may hold files of the same name, which must stay two records."""
    return Records(records.features, records.labels, np.char.add(f"{root.name}/", records.ids.astype(str)),
                   records.clients)


class Cifar10(DataSource):
    """CIFAR-10's python batches (the extracted ``cifar-10-batches-py`` folder): 50,000 training images are the
    sensitive set, the 10,000 test images the test set and, their first ``public_queries``, the public pool."""


    def load(self, cfg: PrepareConfig, *, seed: int, client_column: str | None = None,
             sink: SetSink | None = None, map_parts: PartMapper | None = None) -> LoadedData:
        folder = Path(cfg.path)
        if cfg.download and not (folder / "batches.meta").exists():
            self._download(folder)
        splits, names = load_cifar10(folder, channels=cfg.channels or 3)
        shape = DataShape.image(channels=cfg.channels or 3, height=32, width=32, classes=_classes(cfg, names))
        splits = {k: _resized(v, shape, cfg.image_size) for k, v in splits.items()}
        shape = _resized_shape(shape, cfg.image_size)
        sink = sink or SetSink()
        sink.add_all(_fixed_test_sets(cfg, splits["train"], splits["test"]))
        _image_pools(cfg, shape, sink)
        return LoadedData(sink.close(), shape, self.files(cfg), _image_rule(shape, "tensor", native=32))

    @staticmethod
    def _download(folder: Path) -> None:
        from torchvision.datasets import CIFAR10  # deferred: only when the user asks for a download

        CIFAR10(root=str(folder.parent), train=True, download=True)
        if folder.name != "cifar-10-batches-py":
            raise DataError(f"prepare.path: torchvision fetched {folder.parent / 'cifar-10-batches-py'}; point "
                            "prepare.path at it")

    def record_ids(self, cfg: PrepareConfig) -> list[str]:
        splits, _ = load_cifar10(Path(cfg.path), channels=1)
        return [i for records in splits.values() for i in records.ids.tolist()]

    def training_ids(self, cfg: PrepareConfig) -> list[str]:
        splits, _ = load_cifar10(Path(cfg.path), channels=1)
        return [str(i) for i in splits["train"].ids]

    def files(self, cfg: PrepareConfig) -> list[Path]:
        folder = Path(cfg.path)
        return [folder / "batches.meta"] + [folder / name for names in
                                            (("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
                                              "data_batch_5"), ("test_batch",)) for name in names]


def _resized(records: Records, shape: DataShape, size: int | None) -> Records:
    """Images resized to ``size`` a side (bilinear, as an image folder's are); None: as they are."""
    if size is None or (size == shape.height == shape.side):
        return records
    import torch  # deferred: the library's data modules stay torch-free for the command line's checks
    from torch.nn import functional

    images = torch.as_tensor(records.features).reshape(len(records), shape.channels, shape.height, shape.side)
    resized = functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    return Records(resized.reshape(len(records), -1).clamp(0, 1).numpy().astype(np.float32), records.labels,
                   records.ids, records.clients)


def _resized_shape(shape: DataShape, size: int | None) -> DataShape:
    if size is None:
        return shape
    return DataShape.image(channels=shape.channels, height=size, width=size, classes=shape.classes)


class Svhn(DataSource):
    """SVHN's cropped digits (``train_32x32.mat``, ``test_32x32.mat``): 32×32 colour (or, with channels 1,
    luminance); label 10 is the digit 0."""


    def load(self, cfg: PrepareConfig, *, seed: int, client_column: str | None = None,
             sink: SetSink | None = None, map_parts: PartMapper | None = None) -> LoadedData:
        channels = cfg.channels or 3
        splits = load_svhn(Path(cfg.path), grayscale=channels == 1)
        shape = DataShape.image(channels=channels, height=32, width=32, classes=_classes(cfg, DIGIT_CLASSES))
        splits = {k: _resized(v, shape, cfg.image_size) for k, v in splits.items()}
        shape = _resized_shape(shape, cfg.image_size)
        sink = sink or SetSink()
        sink.add_all(_fixed_test_sets(cfg, splits["train"], splits["test"]))
        _image_pools(cfg, shape, sink)
        return LoadedData(sink.close(), shape, self.files(cfg), _image_rule(shape, "tensor", native=32))

    def record_ids(self, cfg: PrepareConfig) -> list[str]:
        splits = load_svhn(Path(cfg.path), grayscale=True)
        return [i for records in splits.values() for i in records.ids.tolist()]

    def training_ids(self, cfg: PrepareConfig) -> list[str]:
        return [str(i) for i in load_svhn(Path(cfg.path), grayscale=True)["train"].ids]

    def files(self, cfg: PrepareConfig) -> list[Path]:
        return [Path(cfg.path) / "train_32x32.mat", Path(cfg.path) / "test_32x32.mat"]


class ImageFolder(DataSource):
    """torchvision's layout: ``prepare.path/<class>/<image>.png`` (PNG or JPEG), any size (``image_size``
    resizes) and 1 or 3 channels. A record's id is its path under the folder's parent (``xrays/cat/0042.png``);
    an erasure deletes the file."""

    rewritable = True

    def load(self, cfg: PrepareConfig, *, seed: int, client_column: str | None = None,
             sink: SetSink | None = None, map_parts: PartMapper | None = None) -> LoadedData:
        sink = sink or SetSink()
        try:
            return self._read(cfg, seed=seed, sink=sink)
        except BaseException:
            sink.abort()
            raise

    def _read(self, cfg: PrepareConfig, *, seed: int, sink: SetSink) -> LoadedData:
        sink.pixels_as_bytes()  # every image here is decoded from 8 bits a channel (resized by Pillow: still 8)
        channels = cfg.channels or 3
        declared = cfg.schema.labels if cfg.schema is not None else None
        root = Path(cfg.path)
        main = image_folder_files(root, classes=declared, others=cfg.schema is not None and cfg.schema.labels_other)
        test = image_folder_files(Path(cfg.test_path), classes=main.names) if cfg.test_path is not None else None
        pools = _pool_folders(cfg)
        # ids are paths: checked across the folders before a pixel is decoded
        _unique_across([(f"{f.root} (prepare.{key})", np.char.add(f"{f.root.name}/", f.ids)) for key, f in
                        (("path", main), *([("test_path", test)] if test is not None else []),
                         *((f"{name}_path", folder) for name, folder in pools))])
        shares = _shares(cfg, test=test is None, public=cfg.public_path is None, target=False)
        image: tuple[int, int, int] | None = None
        for records, image in image_batches(main, channels=channels, size=cfg.image_size):  # noqa: B007 (the last)
            sink.add_split(_prefixed(records, root), shares, rest="sensitive", seed=seed)
        assert image is not None  # image_folder_files refuses a folder without images
        shape = DataShape.image(channels=image[0], height=image[1], width=image[2], classes=main.names)
        for records, test_image in image_batches(test, channels=channels, size=cfg.image_size) if test else ():
            if test_image != shape.image_shape:
                raise DataError(f"prepare.test_path: {cfg.test_path} holds {test_image[1]}×{test_image[2]} images, "
                                f"{cfg.path} {shape.height}×{shape.side} (set prepare.image_size)")
            sink.add("test", _prefixed(records, Path(str(cfg.test_path))))
        _image_pools(cfg, shape, sink, pools)
        return LoadedData(sink.close(), shape, self.files(cfg), _image_rule(shape, "pillow"))

    @staticmethod
    def _roots(cfg: PrepareConfig) -> list[Path]:
        return [Path(p) for p in (cfg.path, cfg.test_path, cfg.public_path, cfg.target_path) if p is not None]

    def record_ids(self, cfg: PrepareConfig) -> list[str]:
        return [f"{root.name}/{f.relative_to(root).as_posix()}" for root in self._roots(cfg) if root.is_dir()
                for f in image_files(root)]

    def files(self, cfg: PrepareConfig) -> list[Path]:
        return [f for root in self._roots(cfg) if root.is_dir() for f in image_files(root)]

    def erase(self, cfg: PrepareConfig, drop: Callable[[str], bool]) -> int:
        removed = 0
        for root in self._roots(cfg):
            for file in image_files(root) if root.is_dir() else []:
                if file.suffix.lower() in IMAGE_SUFFIXES and drop(f"{root.name}/{file.relative_to(root).as_posix()}"):
                    file.unlink()
                    removed += 1
        return removed


class Table(DataSource):
    """A table (CSV, or Parquet by suffix, or a folder of Parquet parts) with an id column, a label column and
    feature columns, encoded by the declared schema (privpipe.data.tabular). ``test_path`` (labeled),
    ``public_path`` and ``target_path`` (unlabeled: a label column is ignored) are tables with the same columns.
    A partitioned table's parts are encoded apart where ``map_parts`` maps them (privpipe.data.partitioned), the
    sets the same as read in turn. An erasure rewrites each file (part) that holds a row to go, without it."""

    rewritable = True

    def load(self, cfg: PrepareConfig, *, seed: int, client_column: str | None = None,
             sink: SetSink | None = None, map_parts: PartMapper | None = None) -> LoadedData:
        if cfg.schema is None or cfg.schema.labels is None:  # the schema stage completes it before a load
            raise ConfigError("prepare.schema: a csv data set needs its schema, declared or discovered (the schema "
                              "stage)")
        sink = sink or SetSink()
        index = IdIndex(None if sink.folder is None else sink.folder / ".ids")
        try:
            return self._read(cfg, seed=seed, client_column=client_column, sink=sink, index=index,
                              map_parts=map_parts)
        except BaseException:
            sink.abort()
            index.abort()
            raise

    def _read(self, cfg: PrepareConfig, *, seed: int, client_column: str | None, sink: SetSink, index: IdIndex,
              map_parts: PartMapper | None) -> LoadedData:
        assert cfg.schema is not None and cfg.schema.labels is not None  # (load checked it)
        features = feature_names(Path(cfg.path), id_column=cfg.id_column, label_column=cfg.label_column,
                                 client_column=client_column, feature_columns=cfg.feature_columns)
        shares = _shares(cfg, test=cfg.test_path is None, public=cfg.public_path is None, target=False)
        # the main file (split by keyed draws), then the other files whole; the main file's feature columns, which
        # the others must have too (their label column, in an unlabeled pool, is neither read nor a feature)
        others = [(name, Path(path), cfg.label_column if labeled else None)
                  for name, path, labeled in (("test", cfg.test_path, True), ("public", cfg.public_path, False),
                                              ("target", cfg.target_path if cfg.target_domain else None, False))
                  if path is not None]
        spec = PartSpec(schema=cfg.schema, id_column=cfg.id_column, label_column=cfg.label_column,
                        feature_columns=tuple(features), client_column=client_column,
                        shares=tuple(shares.items()), rest="sensitive", seed=seed)
        parts = table_parts(Path(cfg.path))
        if map_parts is not None and len(parts) > 1 and sink.folder is not None:  # the parts encoded apart
            shape = merge_parts(map_parts(part_jobs(parts, spec, sink.folder / ".parts")), sink, index)
            shutil.rmtree(sink.folder / ".parts", ignore_errors=True)
            if shape is None:
                raise DataError(f"{cfg.path}: no records")
        else:  # the main table (its parts in turn), split as it is read
            shape = encode_split(Path(cfg.path), spec, sink, index=index)
        for name, path, label_column in others:  # whole sets
            for records, _, _ in encode_table_batches(path, cfg.schema, id_column=cfg.id_column,
                                                      label_column=label_column, feature_columns=features):
                index.add(records.ids)
                sink.add(name, records)
        assert shape is not None  # encode_table_batches refuses a file without records
        files = [("path", Path(cfg.path)), *((f"{name}_path", path) for name, path, _ in others)]
        if index.any_repeat():  # a repeat of 128-bit hashes: named (or found a collision) on the ids themselves
            self._refuse_repeated_ids(cfg, files)
        rule = TableInput(columns=tuple(c for name in features if (c := cfg.schema.column(name)) is not None))
        return LoadedData(sink.close(), shape, [part for _, path in files for part in table_parts(path)], rule)

    @staticmethod
    def _refuse_repeated_ids(cfg: PrepareConfig, files: list[tuple[str, Path]]) -> None:
        """An id repeated within a file (refused naming both lines) or across files (naming both, by the key that
        names each: one file named twice is two), checked on the ids themselves: the whole id columns in memory,
        on this path alone."""
        _unique_across([(f"{path} (prepare.{key})", file_ids(path, cfg.id_column)) for key, path in files])

    def record_ids(self, cfg: PrepareConfig) -> list[str]:
        ids = []
        for path in self.files(cfg):
            if cfg.id_column not in table_header(path):
                raise ConfigError(f"prepare.id_column: {cfg.id_column!r} is not a column of {path}")
            ids += file_ids(path, cfg.id_column).tolist()
        return ids

    def training_count(self, cfg: PrepareConfig) -> int:
        if cfg.id_column not in table_header(Path(cfg.path)):
            raise ConfigError(f"prepare.id_column: {cfg.id_column!r} is not a column of {cfg.path}")
        return sum(len(batch) for batch in table_batches(Path(cfg.path), columns=[cfg.id_column]))

    def files(self, cfg: PrepareConfig) -> list[Path]:
        return [part for p in (cfg.path, cfg.test_path, cfg.public_path, cfg.target_path) if p is not None
                for part in table_parts(Path(p))]

    def erase(self, cfg: PrepareConfig, drop: Callable[[str], bool]) -> int:
        return sum(erase_rows(path, cfg.id_column, drop) for path in self.files(cfg))  # a batch at a time


def data_source(name: str) -> DataSource:
    """The kind ``prepare.dataset`` names."""
    DATA_KINDS.check(name)  # (a ConfigError naming prepare.dataset and the kinds)
    kind = DATA_KINDS[name]
    source: DataSource = kind.load()(kind)
    return source
