"""The raw data source: the embedded default is written only where the DVC pointer names its bytes."""

from __future__ import annotations

import hashlib

import pytest

from conftest import write_digits_pointer, write_params
from privpipe.config import load_params
from privpipe.data import DataError
from privpipe.data.digits import EMBEDDED_DIGITS_MD5
from tasks.source import ensure_default_data


def test_the_embedded_version_is_written_once(project):
    write_params(project)
    params = load_params("params.yaml")
    assert ensure_default_data(params) is True
    assert hashlib.md5((project / "data/raw/digits.csv").read_bytes()).hexdigest() == EMBEDDED_DIGITS_MD5
    assert ensure_default_data(params) is False  # present: left alone


def test_a_later_version_is_never_rewritten_from_scikit_learn(project):
    """After an erasure the pointer names a version without some records; writing the embedded
    bytes would bring them back, so without DVC's copy the command stops and names the pointer."""
    write_digits_pointer(project)
    pointer = project / "data/raw/digits.csv.dvc"
    pointer.write_text(pointer.read_text().replace(EMBEDDED_DIGITS_MD5, "0123456789abcdef0123456789abcdef"))
    write_params(project)
    with pytest.raises(DataError, match=r"data/raw/digits.csv.dvc: names data version 0123456789abcdef"):
        ensure_default_data(load_params("params.yaml"))
    assert not (project / "data/raw/digits.csv").exists()


def test_a_later_version_comes_back_from_dvc(project):
    import subprocess
    import sys

    write_params(project)
    params = load_params("params.yaml")
    ensure_default_data(params)
    csv = project / "data/raw/digits.csv"
    csv.write_text("".join(line for line in csv.read_text().splitlines(keepends=True)
                           if not line.startswith("digits-0042,")))  # a later version: one record erased
    later = csv.read_bytes()
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=project, check=True)
    subprocess.run([*dvc, "add", "-q", "data/raw/digits.csv"], cwd=project, check=True)
    csv.unlink()
    assert ensure_default_data(params) is True
    assert csv.read_bytes() == later  # from DVC's cache, not scikit-learn's copy
