"""The head's files: its reference for the next removal is saved beside its state and taken back on load."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from privpipe.privacy import NoiseSource
from privpipe.removal import RemovableHead
from small_heads import save_small_head, small_head
from tasks.removal.store import REFERENCE_FILE, forget_removed, load_head


def _saved_head(folder: Path) -> RemovableHead:
    head = small_head(60, 4, 3)
    save_small_head(folder, head, np.array([f"r-{i}" for i in range(60)]))
    return head


def _no_rebuild(head: RemovableHead) -> list[object]:
    calls: list[object] = []
    head._build_reference = lambda *a: calls.append(a)  # type: ignore[method-assign, assignment]
    return calls


def test_a_loaded_head_removes_from_its_saved_reference_as_the_head_that_was_saved(tmp_path: Path) -> None:
    """The removal run's load: no O(n d²) rebuild, and the same step as in the process that saved it."""
    head = _saved_head(tmp_path / "head")
    loaded, ids, _ = load_head(tmp_path / "head")
    rebuilds = _no_rebuild(loaded)
    assert loaded.remove([7], noise=NoiseSource(seed=1, secure=False)) == \
        head.remove([7], noise=NoiseSource(seed=1, secure=False))
    np.testing.assert_array_equal(loaded.W, head.W)
    assert rebuilds == []
    del loaded._build_reference  # (the class's again)
    # what a removal run saves: the reference moved to the new weights, over the rows left, nothing of row 7
    ids = forget_removed(loaded, ids, _Queue())  # type: ignore[arg-type]  # (the one method it calls)
    save_small_head(tmp_path / "next", loaded, ids)
    with np.load(tmp_path / "next" / REFERENCE_FILE) as saved:
        assert not saved["over"][7] and not saved["curvature"][:, 7].any()
        np.testing.assert_array_equal(saved["at_W"], loaded.W)
    again, _, _ = load_head(tmp_path / "next")
    assert again._ref is not None and again.removed_since_reference == 0


@pytest.mark.parametrize("damage", ["cut", "other state"])
def test_a_damaged_or_stale_reference_is_rebuilt_with_a_warning(tmp_path: Path, damage: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """It is derived from state.npz: the head still loads and removes, from a reference built again."""
    head = _saved_head(tmp_path / "head")
    file = tmp_path / "head" / REFERENCE_FILE
    if damage == "cut":
        file.write_bytes(file.read_bytes()[:100])
    else:
        other = _saved_head(tmp_path / "other")
        other.remove([1], noise=NoiseSource(seed=1, secure=False))
        other.forget_removed()
        np.savez(file, **other.reference_state())  # type: ignore[arg-type]
        shutil.rmtree(tmp_path / "other")
    with caplog.at_level(logging.WARNING):
        loaded, _, _ = load_head(tmp_path / "head")
    assert loaded._ref is None
    assert REFERENCE_FILE in caplog.text and "rebuilt" in caplog.text
    a, b = loaded.remove([7], noise=NoiseSource(seed=1, secure=False)), head.remove([7], noise=NoiseSource(seed=1,
                                                                                                       secure=False))
    assert a is not None and b is not None and a.mechanism is b.mechanism and a.used == pytest.approx(b.used, rel=1e-12)
    np.testing.assert_allclose(loaded.W, head.W, rtol=0, atol=1e-12)  # (H₀ formed anew: rounding apart)


class _Queue:
    """The one thing forget_removed asks of the deletion queue: a row's hashed id."""

    def hash_record_id(self, record_id: str) -> str:
        return "h-" + record_id
