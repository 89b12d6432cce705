"""Labelled texts from local files: JSONL or CSV, or 20 Newsgroups (its tarball or scikit-learn's cache).

    corpus = load_corpus("data/raw/texts.jsonl", format="auto", text_column="text", label_column="label",
                         client_column=None, split_column="split", test_fraction=0.2, seed=0)

Each row needs a text and a label; a client column (the natural clients of federated
learning) and a split column (``train``/``test``) are optional. Without a split column
the test set is a seeded, per-record draw (a keyed hash of ``"split:{seed}:{id}"``, see
:mod:`privpipe.data.split`), so adding or erasing a row never moves another between train
and test. A record's id is its line (JSONL) or row (CSV) number, or the value of an ``id``
column where the file has one. privpipe never rewrites a text file (an erased record is
filtered out at prepare time), so line numbers stay put; a file whose owner deletes lines
by hand should carry an ``id`` column, or every later record's id shifts.

The class list is the sorted set of label values in the file. It is treated as public
(the task's label set), as the class count is for the image sets.

``format="20newsgroups"`` reads the "bydate" split from ``path``: the original
``20news-bydate.tar.gz``, that tarball extracted, scikit-learn's ``20news-bydate_py3.pkz``
cache, or a folder (a scikit-learn data home) holding the tarball or the cache; an empty
``path`` means scikit-learn's own data home. Headers, signature footers and quoted lines are
removed with scikit-learn's helpers (``fetch_20newsgroups(remove=("headers", "footers",
"quotes"))``), empty posts are dropped, the classes are the sorted newsgroup names and a
record's id is ``<split>/<newsgroup>/<file>``.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
import pickle
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from privpipe.config.text import TEXT_FORMATS
from privpipe.data.records import DataError, read_text
from privpipe.data.split import assign_sets
from privpipe.data.tabular import canonical_name

__all__ = ["TextSet", "Corpus", "load_corpus", "FORMATS"]

FORMATS = TEXT_FORMATS
SPLITS = ("train", "test")


@dataclass(frozen=True)
class TextSet:
    texts: list[str]
    labels: np.ndarray  # int64 indices into Corpus.classes
    ids: np.ndarray  # str
    clients: np.ndarray | None  # str, the natural client of each record, if the data has one

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class Corpus:
    train: TextSet
    test: TextSet
    classes: tuple[str, ...]
    source: str


def _rows_jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
    rows = []
    with io.StringIO(read_text(path), newline=None) as handle:  # universal newlines, as open() reads text
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.strip())  # the newline would read as a control character in a cut-off string
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc.msg}: column {exc.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
            rows.append((f"line-{number}", row))
    return rows


def _rows_csv(path: Path) -> list[tuple[str, dict[str, Any]]]:
    with io.StringIO(read_text(path), newline="") as handle:
        try:
            return [(f"row-{number}", row) for number, row in enumerate(csv.DictReader(handle), start=2)]
        except csv.Error as exc:
            raise DataError(f"{path}: not valid CSV ({exc})") from None


def _label_text(value: object) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _sorted_classes(values: set[str]) -> tuple[str, ...]:
    """Numeric labels in numeric order (ASCII digits only: ``"²".isdigit()`` holds, ``int("²")`` fails),
    any other set of labels as text."""
    numeric = all(re.fullmatch(r"-?[0-9]+", v) for v in values)
    return tuple(sorted(values, key=int if numeric else str))


def _table(path: Path, fmt: str, *, text_column: str, label_column: str, client_column: str | None,
           split_column: str | None, test_fraction: float, seed: int, classes: tuple[str, ...] | None = None,
           others: bool = False) -> Corpus:
    if not path.is_file():
        raise DataError(f"{path}: text file not found (text.path)")
    fmt = fmt if fmt != "auto" else {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv"}.get(path.suffix.lower(), "")
    if not fmt:
        raise DataError(f"{path}: cannot tell the format from the suffix; set text.format to jsonl or csv")
    rows = _rows_jsonl(path) if fmt == "jsonl" else _rows_csv(path)
    if not rows:
        raise DataError(f"{path}: no records")
    has_split = split_column is not None and any(split_column in row for _, row in rows)
    texts, labels, ids, clients, splits = [], [], [], [], []
    for where, row in rows:
        for column in (text_column, label_column, *([client_column] if client_column else []),
                       *([split_column] if has_split and split_column is not None else [])):
            if row.get(column) in (None, ""):
                raise DataError(f"{path}:{where.split('-')[1]}: missing {column!r}")
        if not isinstance(row[text_column], str):
            raise DataError(f"{path}:{where.split('-')[1]}: {text_column!r} must be a string")
        texts.append(row[text_column])
        labels.append(_label_text(row[label_column]))
        ids.append(str(row["id"]) if row.get("id") not in (None, "") else where)
        if client_column:
            clients.append(str(row[client_column]))
        if has_split and split_column is not None:  # has_split implies it: the second test narrows the type
            split = str(row[split_column])
            if split not in SPLITS:
                raise DataError(f"{path}:{where.split('-')[1]}: {split_column!r} is {split!r}, expected train or test")
            splits.append(split)
    ids_array = np.array(ids)
    if len(np.unique(ids_array)) != len(ids_array):
        raise DataError(f"{path}: record ids are not unique")
    if has_split:
        is_test = np.array(splits) == "test"
    else:
        is_test = assign_sets(ids_array, {"test": test_fraction}, rest="train", seed=seed) == "test"
    if classes is None:
        classes = _sorted_classes(set(labels))
    index = {canonical_name(c): i for i, c in enumerate(classes)}
    positions = [index.get(canonical_name(v)) for v in labels]
    outside = next((k for k, p in enumerate(positions) if p is None), None)
    if outside is not None and not others:
        raise DataError(f"{path}:{rows[outside][0].split('-')[1]}: label {labels[outside]!r} (column "
                        f"{label_column!r}) is not in text.labels ({', '.join(classes)})")
    known = np.array([p is not None for p in positions], dtype=bool)  # a discovered set: the others left out
    label_array = np.array([-1 if p is None else p for p in positions], dtype=np.int64)
    client_array = np.array(clients) if client_column else None

    def part(mask: np.ndarray) -> TextSet:
        picked = np.flatnonzero(mask & known)
        return TextSet([texts[i] for i in picked], label_array[picked], ids_array[picked],
                       None if client_array is None else client_array[picked])

    corpus = Corpus(part(~is_test), part(is_test), classes, str(path))
    if not len(corpus.train) or not len(corpus.test):
        raise DataError(f"{path}: the {'train' if not len(corpus.train) else 'test'} split is empty")
    if len(np.unique(corpus.train.labels)) < 2:  # one class "trains" to accuracy 1.0 and means nothing
        only = classes[int(corpus.train.labels[0])]
        raise DataError(f"{path}: every training record has the label {only!r} (column {label_column!r}): "
                        "a classifier needs at least two classes")
    return corpus


# scikit-learn's names: the tarball it downloads, the folders inside, and the cache it writes in its data home
NEWSGROUPS_TARBALL = "20news-bydate.tar.gz"
NEWSGROUPS_CACHE = "20news-bydate_py3.pkz"
NEWSGROUPS_FOLDERS = {"train": "20news-bydate-train", "test": "20news-bydate-test"}
NEWSGROUPS_EXPECTED = (f"the {NEWSGROUPS_TARBALL} tarball, scikit-learn's {NEWSGROUPS_CACHE} cache, "
                       f"or a folder holding one of them")

Post = tuple[str, str, str]  # newsgroup, file name, raw text (headers and all)


def _strippers() -> tuple[Callable[[str], str], ...]:
    """scikit-learn's header, footer and quote removal, in the order its ``remove=`` applies them."""
    try:  # deferred: sklearn.datasets takes ~2 s
        from sklearn.datasets._twenty_newsgroups import (
            strip_newsgroup_footer,
            strip_newsgroup_header,
            strip_newsgroup_quoting,
        )
    except ImportError:  # a private module: a later scikit-learn may move it; these are its 1.x definitions
        return _strip_header, _strip_footer, _strip_quoting
    return strip_newsgroup_header, strip_newsgroup_footer, strip_newsgroup_quoting


def _strip_header(text: str) -> str:
    return text.partition("\n\n")[2]


def _strip_footer(text: str) -> str:
    lines = text.strip().split("\n")
    line_num = 0
    for line_num in range(len(lines) - 1, -1, -1):
        if lines[line_num].strip().strip("-") == "":
            break
    return "\n".join(lines[:line_num]) if line_num > 0 else text


_QUOTE_RE = re.compile(r"(writes in|writes:|wrote:|says:|said:|^In article|^Quoted from|^\||^>)")


def _strip_quoting(text: str) -> str:
    return "\n".join(line for line in text.split("\n") if not _QUOTE_RE.search(line))


def _split_of(parts: tuple[str, ...]) -> str | None:
    """``train``/``test`` when ``parts`` ends in ``20news-bydate-<split>/<group>/<file>``."""
    if len(parts) < 3:
        return None
    return next((s for s, folder in NEWSGROUPS_FOLDERS.items() if parts[-3] == folder), None)


def _posts_from_tarball(path: Path) -> dict[str, list[Post]]:
    posts: dict[str, list[Post]] = {s: [] for s in SPLITS}
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive:  # read in place: nothing is extracted to disk
                parts = PurePosixPath(member.name).parts
                split = _split_of(parts) if member.isfile() else None
                handle = archive.extractfile(member) if split is not None else None  # (None only for a non-file)
                if split is not None and handle is not None:
                    raw = handle.read()
                    posts[split].append((parts[-2], parts[-1], raw.decode("latin-1")))  # as scikit-learn decodes
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable tarball ({exc}) (text.path: {NEWSGROUPS_EXPECTED})") from None
    return posts


def _posts_from_folder(folder: Path) -> dict[str, list[Post]]:
    """The tarball extracted: ``20news-bydate-train/<group>/<file>`` and the test twin under ``folder``."""
    posts: dict[str, list[Post]] = {s: [] for s in SPLITS}
    for split, name in NEWSGROUPS_FOLDERS.items():
        for file in (folder / name).glob("*/*"):
            if file.is_file():
                posts[split].append((file.parent.name, file.name, file.read_bytes().decode("latin-1")))
    return posts


def _posts_from_cache(path: Path) -> dict[str, list[Post]]:
    """scikit-learn's cache: a zlib-compressed pickle of ``{"train": Bunch, "test": Bunch}`` (the
    ``load_files`` of each folder), written and read as ``fetch_20newsgroups`` does. Unpickling runs
    code, as it does in scikit-learn: point text.path only at a cache you or scikit-learn wrote."""
    try:
        cache = pickle.loads(codecs.decode(path.read_bytes(), "zlib_codec"))
        posts = {}
        for split in SPLITS:
            bunch = cache[split]
            names = [str(f).replace("\\", "/").rsplit("/", 1)[-1] for f in bunch.filenames]
            posts[split] = [(bunch.target_names[int(t)], name, text)
                            for t, name, text in zip(bunch.target, names, bunch.data, strict=True)]
    except Exception as exc:  # anything unpickling or a foreign pickle can raise
        raise DataError(f"{path}: not a readable scikit-learn 20 Newsgroups cache ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}) (text.path: {NEWSGROUPS_EXPECTED})"
                        ) from None
    return posts


def _default_data_home() -> Path:
    """scikit-learn's data home (``$SCIKIT_LEARN_DATA`` or ``~/scikit_learn_data``), without creating it."""
    return Path(os.environ.get("SCIKIT_LEARN_DATA", "~/scikit_learn_data")).expanduser()


def _download(home: Path) -> Path:
    from sklearn.datasets import fetch_20newsgroups  # deferred: sklearn.datasets takes ~2 s

    try:
        fetch_20newsgroups(data_home=str(home), subset="train", download_if_missing=True)
    except Exception as exc:  # network and disk errors alike: name them on one line
        raise DataError(f"20newsgroups: download into {home} failed ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}) (text.download)") from None
    return home / NEWSGROUPS_CACHE


def _newsgroups_source(path: str | Path | None, *, download: bool) -> Path:
    """The file or folder to read: ``path`` itself, the cache or tarball in the folder ``path``, or scikit-learn's
    default data home when ``path`` is empty; downloaded there first only when ``download`` is set."""
    if path is None or str(path) == "":
        home = _default_data_home()
        if (home / NEWSGROUPS_CACHE).is_file():
            return home / NEWSGROUPS_CACHE
        if download:
            return _download(home)
        raise DataError(f"20newsgroups: not in the local scikit-learn cache ({home / NEWSGROUPS_CACHE}); set "
                        f"text.path to {NEWSGROUPS_EXPECTED}, or text.download: true to fetch it (needs internet)")
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        for candidate in (path / NEWSGROUPS_CACHE, path / NEWSGROUPS_TARBALL):
            if candidate.is_file():
                return candidate
        if all((path / name).is_dir() for name in NEWSGROUPS_FOLDERS.values()):
            return path
        if download:
            return _download(path)
        raise DataError(f"{path}: no {NEWSGROUPS_CACHE}, {NEWSGROUPS_TARBALL} or {NEWSGROUPS_FOLDERS['train']}/ and "
                        f"{NEWSGROUPS_FOLDERS['test']}/ in this folder (text.path: {NEWSGROUPS_EXPECTED}; "
                        f"or text.download: true to fetch it here)")
    if download:  # a cache file's path downloads into its folder, where scikit-learn names the cache so
        return _download(path.parent if path.name in (NEWSGROUPS_CACHE, NEWSGROUPS_TARBALL) else path)
    raise DataError(f"{path}: not found (text.path: {NEWSGROUPS_EXPECTED}; or text.download: true to fetch it)")


def _newsgroups(path: str | Path | None, *, download: bool) -> Corpus:
    """20 Newsgroups by date, as scikit-learn's ``fetch_20newsgroups(remove=("headers", "footers", "quotes"))``
    gives it, empty posts dropped. A record's id is ``<split>/<newsgroup>/<file>``, the post's place in
    the tarball, so it names the same post whichever form (tarball, folder, cache) it was read from."""
    source = _newsgroups_source(path, download=download)
    if source.is_dir():
        posts = _posts_from_folder(source)
    elif source.name.endswith(".pkz"):
        posts = _posts_from_cache(source)
    elif tarfile.is_tarfile(source):
        posts = _posts_from_tarball(source)
    else:
        raise DataError(f"{source}: neither a tarball nor a .pkz cache (text.path: {NEWSGROUPS_EXPECTED})")
    for split, folder in NEWSGROUPS_FOLDERS.items():
        if not posts[split]:
            raise DataError(f"{source}: no posts under {folder}/<newsgroup>/ (text.path: {NEWSGROUPS_EXPECTED})")
    header, footer, quoting = _strippers()
    classes = tuple(sorted({group for split in SPLITS for group, _, _ in posts[split]}))
    index = {c: i for i, c in enumerate(classes)}
    parts = {}
    for split in SPLITS:
        texts, labels, ids = [], [], []
        for group, name, raw in sorted(posts[split], key=lambda p: (p[0], p[1])):  # one order, whichever form was read
            text = quoting(footer(header(raw)))
            if text.strip():
                texts.append(text)
                labels.append(index[group])
                ids.append(f"{split}/{group}/{name}")
        parts[split] = TextSet(texts, np.array(labels, dtype=np.int64), np.array(ids), None)
        if not texts:
            raise DataError(f"{source}: every {split} post is empty once headers, footers and quotes are removed")
    return Corpus(parts["train"], parts["test"], classes, str(source))


def load_corpus(path: str | Path | None, *, format: str, text_column: str, label_column: str,
                client_column: str | None, split_column: str | None, test_fraction: float, seed: int,
                download: bool = False, classes: tuple[str, ...] | None = None, others: bool = False) -> Corpus:
    """Read a labelled text set; raise :class:`DataError` naming the file and line on bad input.

    ``classes``: the label set (declared, or discovered with DP), in label order; a record with another label
    is refused or, with ``others`` (a discovered set, which does not publish it), left out. None: the
    file's own labels (only for data whose label set is public, 20newsgroups' 20 groups).
    ``download`` (20newsgroups only): let scikit-learn fetch the data into ``path`` (a folder) when it is
    not there."""
    if format not in FORMATS:
        raise DataError(f"text.format: unknown {format!r} (choose one of {', '.join(FORMATS)})")
    if format == "20newsgroups":
        return _newsgroups(path, download=download)
    if path is None or str(path) == "":
        raise DataError("text.path: empty (a JSONL or CSV file of texts and labels)")
    return _table(Path(path), format, text_column=text_column, label_column=label_column,
                  client_column=client_column, split_column=split_column, test_fraction=test_fraction, seed=seed,
                  classes=classes, others=others)


def corpus_labels(path: str | Path, *, format: str, label_column: str) -> list[tuple[str, str]]:
    """Each record's (id, label) as the file holds them: what the label set's discovery counts."""
    path = Path(path)
    fmt = format if format != "auto" else {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv"}.get(
        path.suffix.lower(), "")
    if not path.is_file() or not fmt:
        return []  # load_corpus says what is wrong
    rows = _rows_jsonl(path) if fmt == "jsonl" else _rows_csv(path)
    return [(str(row["id"]) if row.get("id") not in (None, "") else where, _label_text(row.get(label_column, "")))
            for where, row in rows]
