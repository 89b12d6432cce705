"""The sets a data kind reads, written a batch at a time, so that preparing a file of any length takes bounded memory.

    sink = SetSink(folder, drop=withheld)     # folder None: the sets stay in memory (tests, small data)
    for batch in batches:
        sink.add("sensitive", batch)           # Records of one batch; ``drop`` leaves records out as they come
    sets = sink.close()                        # {name: Records}: memory-mapped from folder/<name>/*.npy

Each set's arrays go to raw files as batches come and become ``.npy`` files at the end (one sequential copy, not a
memory map: a mapped page read counts in the process's memory), byte for byte what ``Records.save`` writes for the
same records. The sink checks what a set's records must satisfy batch by batch (one width; finite features, which
``Records`` checks on each batch) and keeps a count per label (the checks prepare makes on a whole set read those
counts); an id repeated anywhere across the sets is found by :class:`IdIndex` in bounded memory.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from privpipe.data.records import RECORD_FILES, DataError, Records, pixel_bytes
from privpipe.data.split import assign_sets
from privpipe.files import open_private, private_file, private_folder

__all__ = ["SetSink", "SetWriter", "IdIndex", "read_set_chunks", "read_set_ids", "mapped_set", "gather_set",
           "CHUNK_BYTES"]

#: bytes of a written set read back at a time (32 MB: 2,730 images of 3×32×32, 279k rows of 30 features)
CHUNK_BYTES = 1 << 25
_COPY_BYTES = 1 << 22
_BUCKETS = 64  # IdIndex's bucket files: an n-row data set holds n/64 hashes in memory at a time


def _header(path: Path) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    """A ``.npy`` file's dtype, shape and the byte its data starts at."""
    with open(path, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(handle)
        if fortran:
            raise DataError(f"{path}: a Fortran-ordered array (privpipe writes C order)")
        return dtype, shape, handle.tell()


def _write_header(out: IO[bytes], dtype: np.dtype[Any], shape: tuple[int, ...]) -> None:
    """The header ``np.save`` writes for an array of this dtype and shape (version 1.0, as it chooses for these)."""
    np.lib.format.write_array_header_1_0(out, {"descr": np.lib.format.dtype_to_descr(dtype),
                                               "fortran_order": False, "shape": shape})


def _array_chunks(folder: Path, names: list[str], rows: int | None) -> Iterator[dict[str, np.ndarray]]:
    """The named arrays of a written set, ``rows`` at a time (None: ~32 MB of them a chunk), read from the files."""
    headers = {name: _header(folder / f"{name}.npy") for name in names}
    total = headers[names[0]][1][0]
    per_row = {name: int(np.prod(shape[1:], dtype=np.int64)) for name, (_, shape, _) in headers.items()}
    row_bytes = sum(per_row[name] * dtype.itemsize for name, (dtype, _, _) in headers.items())
    rows = rows or max(1, CHUNK_BYTES // max(row_bytes, 1))
    with ExitStack() as files:
        handles = {name: files.enter_context(open(folder / f"{name}.npy", "rb")) for name in names}
        for name, (_, _, offset) in headers.items():
            handles[name].seek(offset)
        for start in range(0, max(total, 1), rows):  # an empty set: one empty chunk (a merge still makes the set)
            count = min(rows, total - start)
            yield {name: np.fromfile(handles[name], dtype=dtype, count=count * per_row[name]).reshape(
                (count, *shape[1:])) for name, (dtype, shape, _) in headers.items()}


def _array_names(folder: Path) -> list[str]:
    """The arrays a written set holds: features, labels, ids, and clients where records have them."""
    return [name.removesuffix(".npy") for name in RECORD_FILES if (folder / name).is_file()]


def read_set_chunks(folder: Path, *, rows: int | None = None) -> Iterator[Records]:
    """A written set's records, ``rows`` at a time (None: ~32 MB a chunk), read from its files (not mapped:
    memory stays one chunk's)."""
    for arrays in _array_chunks(folder, _array_names(folder), rows):
        yield Records(arrays["features"], arrays["labels"], arrays["ids"], arrays.get("clients"))


def read_set_ids(folder: Path) -> Iterator[np.ndarray]:
    """A written set's ids, a chunk at a time (its features are not read)."""
    for arrays in _array_chunks(folder, ["ids"], None):
        yield arrays["ids"]


def mapped_set(folder: Path) -> Records:
    """A written set as Records over memory maps (checked as it was written: no whole-set pass here), its features
    as stored (pixels as bytes: Records.load reads them as floats)."""
    arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in _array_names(folder)}
    return Records(arrays["features"], arrays["labels"], arrays["ids"], arrays.get("clients"), checked=True)


class SetWriter:
    """One set's records, appended a batch at a time: to raw files under ``folder`` (the ``.npy`` files at
    :meth:`close`), or, with no folder, kept in memory."""

    def __init__(self, name: str, folder: Path | None, *, pixels_as_bytes: bool = False) -> None:
        self.name = name
        self.folder = folder
        self.pixels_as_bytes = pixels_as_bytes  # features are 8-bit pixels: written as bytes (read back as floats)
        self.rows = 0
        self.labels: dict[int, int] = {}  # records per label value (UNLABELED included)
        self._width: int | None = None
        self._dtypes: dict[str, np.dtype[Any]] = {}
        self._parts: dict[str, IO[bytes]] = {}
        self._id_parts: dict[str, list[tuple[int, np.dtype[Any]]]] = {"ids": [], "clients": []}
        self._memory: list[Records] = []
        self._clients: bool | None = None
        if folder is not None:
            private_folder(folder)

    def append(self, records: Records) -> None:
        width = records.features.shape[1]
        if self._width is None:
            self._width, self._clients = width, records.clients is not None
        elif width != self._width:
            raise DataError(f"{self.name} set: records of {width} values after records of {self._width}")
        elif (records.clients is not None) != self._clients:
            raise DataError(f"{self.name} set: records with and without clients")
        values, first, counts = np.unique(records.labels, return_index=True, return_counts=True)
        for i in np.argsort(first):  # in the order the labels first occur: a refusal names the first bad one
            self.labels[int(values[i])] = self.labels.get(int(values[i]), 0) + int(counts[i])
        self.rows += len(records)
        if self.folder is None:
            self._memory.append(records)
            return
        features = pixel_bytes(records.features) if self.pixels_as_bytes and records.features.dtype != np.uint8 \
            else records.features
        arrays = {"features": features, "labels": records.labels, "ids": records.ids.astype(str)}
        if records.clients is not None:
            arrays["clients"] = records.clients.astype(str)
        for name, array in arrays.items():
            if name not in self._parts:
                self._parts[name] = open_private(self.folder / f"{name}.part")
                self._dtypes[name] = array.dtype
            if name in self._id_parts:  # strings of this batch's width: widened to the set's at close
                self._id_parts[name].append((len(array), array.dtype))
            else:
                array = array.astype(self._dtypes[name], copy=False)
            np.ascontiguousarray(array).tofile(self._parts[name])

    def abort(self) -> None:
        """Close the raw files (the folder they are in is the caller's to remove)."""
        for part in self._parts.values():
            part.close()

    def close(self) -> Records:
        if self._width is None:
            raise DataError(f"{self.name} set: no records were added")
        if self.folder is None:
            parts = self._memory
            if len(parts) == 1:
                return parts[0]
            clients = None if parts[0].clients is None else np.concatenate([r.clients for r in parts])
            return Records(np.concatenate([r.features for r in parts]), np.concatenate([r.labels for r in parts]),
                           np.concatenate([r.ids for r in parts]), clients)
        for name, part in self._parts.items():
            part.close()
            self._finish(name)
        return mapped_set(self.folder)

    def _finish(self, name: str) -> None:
        """``name.part`` as ``name.npy``: np.save's header, then the data (strings widened to the widest)."""
        assert self.folder is not None and self._width is not None
        part = self.folder / f"{name}.part"
        with private_file(self.folder / f"{name}.npy") as out, open(part, "rb") as raw:
            if name not in self._id_parts:
                shape = (self.rows, self._width) if name == "features" else (self.rows,)
                _write_header(out, self._dtypes[name], shape)
                shutil.copyfileobj(raw, out, _COPY_BYTES)
            else:
                batches = self._id_parts[name]
                widest = max(batches, key=lambda b: b[1].itemsize)[1]
                _write_header(out, widest, (self.rows,))
                for count, dtype in batches:
                    np.fromfile(raw, dtype=dtype, count=count).astype(widest).tofile(out)
        part.unlink()


@dataclass
class IdIndex:
    """Every id added, checked for repeats in bounded memory: each id's 128-bit hash goes to one of 64 bucket files by
    its top bits, and each bucket is sorted alone. A repeat it reports is a repeat of hashes: the caller confirms it
    on the ids themselves, and names it."""

    folder: Path | None
    _buckets: list[list[np.ndarray]] = field(default_factory=lambda: [[] for _ in range(_BUCKETS)])
    _files: dict[int, IO[bytes]] = field(default_factory=dict)

    _RECORD = np.dtype([("h1", "<u8"), ("h2", "<u8")])

    def add(self, ids: np.ndarray) -> None:
        h1, h2 = _id_hashes(ids)
        entries = np.empty(len(ids), dtype=self._RECORD)
        entries["h1"], entries["h2"] = h1, h2
        bucket = (h1 >> np.uint64(58)).astype(np.int64)
        for b in np.unique(bucket).tolist():
            chunk = entries[bucket == b]
            if self.folder is None:
                self._buckets[b].append(chunk)
            else:
                if b not in self._files:
                    private_folder(self.folder)
                    self._files[b] = open_private(self.folder / f"ids-{b:02d}.bin")
                chunk.tofile(self._files[b])

    def any_repeat(self) -> bool:
        """Whether two ids added had the same hash (the caller confirms it on the ids, and names them)."""
        self.abort()
        try:
            for b in range(_BUCKETS):
                if self.folder is None:
                    entries = np.concatenate(self._buckets[b]) if self._buckets[b] else np.empty(0, self._RECORD)
                elif (self.folder / f"ids-{b:02d}.bin").is_file():
                    entries = np.fromfile(self.folder / f"ids-{b:02d}.bin", dtype=self._RECORD)
                else:
                    continue
                entries = entries[np.lexsort((entries["h2"], entries["h1"]))]
                if ((entries["h1"][1:] == entries["h1"][:-1]) & (entries["h2"][1:] == entries["h2"][:-1])).any():
                    return True
            return False
        finally:
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)

    def abort(self) -> None:
        """Close the bucket files (what :meth:`any_repeat` reads; on an error, nothing will)."""
        for handle in self._files.values():
            handle.close()


_MULTIPLIERS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))


def _id_hashes(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two 64-bit polynomial hashes of each id's code points (vectorised over the ids, a loop over their
    length); an id's hash does not depend on the width of the array that holds it."""
    text = np.asarray(ids).astype(str)
    width = text.dtype.itemsize // 4
    points = text.view(np.uint32).reshape(len(text), width).astype(np.uint64) if width else \
        np.zeros((len(text), 0), np.uint64)
    hashes = []
    with np.errstate(over="ignore"):
        for seed, multiplier in enumerate(_MULTIPLIERS):
            h = np.full(len(text), np.uint64(seed + 1), dtype=np.uint64)
            for k in range(width):  # padding code points are 0, past the id's end: h·m + 0 would differ, so skip
                live = points[:, k] != 0
                h = np.where(live, h * multiplier + points[:, k] + np.uint64(1), h)
            h ^= h >> np.uint64(31)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(29)
            hashes.append(h)
    return hashes[0], hashes[1]


class SetSink:
    """The sets of one prepare, by name, written as batches come (``folder``/<name>/), or kept in memory
    (``folder`` None). ``drop`` (ids → bool mask) leaves records out before anything of them is written."""

    def __init__(self, folder: Path | None = None, *, drop: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.folder = folder
        self.drop = drop
        self.writers: dict[str, SetWriter] = {}
        self.pixels = False

    def pixels_as_bytes(self) -> None:
        """The features to come are 8-bit pixels (k/255): written to disk as the bytes k, a quarter of float32's
        size (Records.load reads them back as the same floats). A sink in memory keeps the floats."""
        self.pixels = True

    def add(self, name: str, records: Records) -> None:
        if self.drop is not None and len(records):
            gone = self.drop(records.ids)
            if gone.any():
                records = records.subset(np.flatnonzero(~gone))
        if name not in self.writers:
            self.writers[name] = SetWriter(name, None if self.folder is None else self.folder / name,
                                           pixels_as_bytes=self.pixels)
        self.writers[name].append(records)

    def add_split(self, records: Records, shares: dict[str, float], *, rest: str, seed: int) -> None:
        """One batch of a file's records, each to its keyed set (privpipe.data.split.assign_sets). Every set gets
        its share of every batch, empty or not, so that each set's arrays come out as one split of the whole
        file's would (the ids' width included)."""
        names = assign_sets(records.ids, shares, rest=rest, seed=seed)
        for name in (*shares, rest):
            self.add(name, records.subset(np.flatnonzero(names == name)))

    def add_all(self, sets: dict[str, Records]) -> None:
        for name, records in sets.items():
            self.add(name, records)

    def close(self) -> dict[str, Records]:
        return {name: writer.close() for name, writer in self.writers.items()}

    def abort(self) -> None:
        """Close every set's raw files: a read stopped by an error (its folder is removed by whoever made it)."""
        for writer in self.writers.values():
            writer.abort()

    def label_counts(self, name: str) -> dict[int, int]:
        """Records per label value in set ``name`` (as added, after ``drop``)."""
        return dict(self.writers[name].labels)


def gather_set(source: Path, target: Path, index: np.ndarray, *,
               rows: int | None = None) -> tuple[Records, dict[int, int]]:
    """The records of the set in ``source`` at the ascending positions ``index``, written to ``target``, and their
    count per label."""
    writer = SetWriter(target.name, target)
    start = 0
    for chunk in read_set_chunks(source, rows=rows):
        end = start + len(chunk)
        lo, hi = np.searchsorted(index, [start, end])
        writer.append(chunk.subset(index[lo:hi] - start))
        start = end
    return writer.close(), dict(writer.labels)
