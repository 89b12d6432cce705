"""Files that hold sensitive records or their features are their owner's alone: mode 0600, their folders 0700
(issue 35, point 9), and hold the same bytes a plain write gives (DVC hashes contents, not modes)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from conftest import PROJECT

DIGITS_CSV = "data/raw/digits.csv"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def open_umask():
    """The usual umask (022), whatever the session's: a plain write then gives 0644 files and 0755 folders."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def test_private_file_is_0600_from_its_creation_and_closes_up_an_old_one(tmp_path: Path) -> None:
    from privpipe.files import private_file

    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    with private_file(tmp_path / "a.npy") as out:
        np.save(out, array)
    np.save(tmp_path / "plain.npy", array)
    assert mode(tmp_path / "a.npy") == 0o600 and mode(tmp_path / "plain.npy") == 0o644
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "plain.npy").read_bytes()  # the same bytes
    with private_file(tmp_path / "plain.npy", "w") as out:  # an existing file written over: its mode too
        out.write("é\n")
    assert mode(tmp_path / "plain.npy") == 0o600 and (tmp_path / "plain.npy").read_text("utf-8") == "é\n"


def test_private_folder_is_0700_and_closes_up_an_old_one(tmp_path: Path) -> None:
    from privpipe.files import private_folder

    assert mode(private_folder(tmp_path / "new/inner")) == 0o700
    (tmp_path / "old").mkdir(mode=0o755)
    assert mode(private_folder(tmp_path / "old")) == 0o700


def test_prepared_sets_are_private(tmp_path: Path) -> None:
    """data/prepared/digits/*: the records, their features, labels and ids."""
    from privpipe.config import load_params
    from privpipe.data import export_digits_csv
    from tasks.prepare import run_prepare

    shutil.copy(PROJECT / "params.yaml", tmp_path / "params.yaml")
    export_digits_csv(tmp_path / DIGITS_CSV)
    assert mode(tmp_path / DIGITS_CSV) == 0o600  # `privpipe init-data`: the raw records
    with contextlib.chdir(tmp_path):
        run_prepare(load_params("params.yaml"))
    prepared = tmp_path / "data/prepared/digits"
    arrays = sorted(prepared.rglob("*.npy"))
    assert {p.name for p in arrays} >= {"features.npy", "labels.npy", "ids.npy"}
    assert {str(p.relative_to(prepared)): oct(mode(p)) for p in arrays} == \
        {str(p.relative_to(prepared)): oct(0o600) for p in arrays}
    folders = [prepared, *(p for p in prepared.rglob("*") if p.is_dir())]
    assert {str(p): oct(mode(p)) for p in folders} == {str(p): oct(0o700) for p in folders}


def test_head_state_and_ids_are_private(tmp_path: Path) -> None:
    """artifacts/digits/head/state.npz (the rows' features) and ids.npy were mode 0644."""
    from small_heads import save_small_head, small_head
    from tasks.removal.store import load_head

    head = small_head(20, 3, 2)
    folder = tmp_path / "head"
    ids = np.array([f"r-{i}" for i in range(20)])
    save_small_head(folder, head, ids)
    assert mode(folder / "state.npz") == 0o600 and mode(folder / "ids.npy") == 0o600
    assert mode(folder / "reference.npz") == 0o600  # H₀⁻¹ and G₀ are made of the rows too
    again, read_ids, _ = load_head(folder)
    assert np.array_equal(read_ids, ids) and np.array_equal(again.W, head.W)


def test_request_queue_folder_is_private(tmp_path: Path) -> None:
    """data/requests/<dataset>/ was created 0755 (the README says its owner's alone); an old one is closed up on a
    write."""
    from privpipe.requests import RequestQueue

    queue = RequestQueue(tmp_path / "requests")
    queue.submit(["rec-1"], known=lambda _: True)
    assert mode(tmp_path / "requests") == 0o700
    assert {p.name: oct(mode(p)) for p in (tmp_path / "requests").iterdir()} == \
        {p.name: oct(0o600) for p in (tmp_path / "requests").iterdir()}
    (tmp_path / "old").mkdir(mode=0o755)
    old = RequestQueue(tmp_path / "old")
    with old.processing():
        pass
    assert mode(tmp_path / "old") == 0o700


def test_rewritten_table_is_private(tmp_path: Path) -> None:
    """A removal rewrites the raw table without the erased rows: the rest are still records."""
    from privpipe.data.tabular import read_table, write_table

    path = tmp_path / "t.csv"
    path.write_text("id,label,x\na,0,1\nb,1,2\nc,0,3\n")
    table = read_table(path)
    write_table(table, np.array([True, False, True]))
    assert mode(path) == 0o600 and path.read_text() == "id,label,x\na,0,1\nc,0,3\n"


def test_embedding_cache_is_private(tmp_path: Path) -> None:
    """artifacts/cache/embeddings: the text records' embeddings (the files were 0600, the folder 0755)."""
    from tasks.text.features import _save_atomic

    _save_atomic(tmp_path / "cache/k.npy", np.ones((2, 3), dtype=np.float32))
    assert mode(tmp_path / "cache") == 0o700 and mode(tmp_path / "cache/k.npy") == 0o600
    buffer = io.BytesIO()
    np.save(buffer, np.ones((2, 3), dtype=np.float32))
    assert (tmp_path / "cache/k.npy").read_bytes() == buffer.getvalue()
