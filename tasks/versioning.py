"""Which code and which data a run used: the git commit and the DVC data version."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

__all__ = ["git_commit", "data_version", "combined_version", "file_md5", "pointer_md5", "dvc", "MD5_PATTERN"]

MD5_PATTERN = re.compile(r"[0-9a-f]{32}")  # a file's md5 in a DVC pointer (a folder's ends in .dir)


def git_commit(root: Path = Path(".")) -> str:
    """HEAD's commit, with ``+dirty`` if tracked files differ; ``unknown`` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


def file_md5(path: Path) -> str:
    digest = hashlib.md5()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pointer_md5(pointer: Path) -> str | None:
    """The md5 a file's DVC pointer (``<file>.dvc``) names; None without a pointer, or for a folder's ``.dir``."""
    if not pointer.is_file():
        return None
    outs = (yaml.safe_load(pointer.read_text()) or {}).get("outs") or [{}]
    md5 = str(outs[0].get("md5", ""))
    return md5 if MD5_PATTERN.fullmatch(md5) else None


def combined_version(md5s: list[str]) -> str:
    """The label of several files' bytes (or of one outside DVC): ``untracked:`` and a digest of their md5s."""
    return "untracked:" + hashlib.md5("".join(md5s).encode()).hexdigest()


def data_version(paths: list[Path]) -> str:
    """A label for the exact input bytes.

    For a single DVC-tracked file whose content matches its ``.dvc`` pointer this
    is DVC's own md5 (so ``dvc`` and MLflow agree); otherwise ``untracked:`` plus a
    digest over the files' md5s, or ``modified:`` if the content left its pointer.
    """
    hashes = [file_md5(p) for p in paths]
    if len(paths) == 1:
        tracked = pointer_md5(paths[0].with_name(paths[0].name + ".dvc"))
        if tracked is not None:
            return tracked if tracked == hashes[0] else f"modified:{hashes[0]}"
    return combined_version(hashes)


def dvc(*args: str) -> None:
    """Run the project's dvc (beside this interpreter) in the project folder."""
    program = Path(sys.executable).with_name("dvc")
    result = subprocess.run([str(program) if program.exists() else "dvc", *args], capture_output=True, text=True,
                            env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    if result.returncode != 0:
        raise RuntimeError(f"dvc {' '.join(args)} failed: {result.stderr.strip().splitlines()[-1:]}")
