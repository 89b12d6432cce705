"""Which code and which data a run used: the git commit and the DVC data version."""

from __future__ import annotations

import configparser
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

__all__ = ["git_commit", "data_version", "combined_version", "file_md5", "pointer_md5", "dvc", "MD5_PATTERN",
           "DvcRemote", "dvc_remotes", "restrict_dvc_storage", "file_marks", "FileMarks"]

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


#: each file's name and, where it is there, its device, inode, size, modification and change times (ns)
FileMarks = tuple[tuple[str, ...], ...]


def file_marks(paths: Iterable[Path]) -> FileMarks:
    """What the files' bytes are known by without reading them (sorted by name, each once): equal marks, the same
    bytes. A write, a truncation, a rename or a replace moves a file's change time, which a user cannot set
    (``touch`` sets the modification time only; the clock itself aside), so content can change under an equal size
    and modification time but not under equal marks. What :func:`data_version` would hash, checked without hashing
    it again (a chmod moves the change time too: a false alarm, never a miss)."""
    marks: list[tuple[str, ...]] = []
    for path in sorted({str(p) for p in paths}):
        try:
            info = os.stat(path)
        except OSError:  # gone (or unreadable): a mark of its own, unlike any file's
            marks.append((path,))
            continue
        marks.append((path, str(info.st_dev), str(info.st_ino), str(info.st_size), str(info.st_mtime_ns),
                      str(info.st_ctime_ns)))
    return tuple(marks)


#: the child's first step, before it becomes dvc: ask the kernel to kill it when its parent dies (Linux's
#: PR_SET_PDEATHSIG), so that a killed removal run leaves no ``dvc add`` running on; a parent already gone
#: before the request took effect ends it too. Done in the child, not by preexec_fn (unsafe beside threads).
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(137)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def _dvc_program() -> str:
    program = Path(sys.executable).with_name("dvc")
    return str(program) if program.exists() else shutil.which("dvc") or "dvc"


def dvc(*args: str) -> None:
    """Run the project's dvc (beside this interpreter) in the project folder, as a child that dies with this
    process; then keep DVC's storage its owner's alone (:func:`restrict_dvc_storage`)."""
    command = [_dvc_program(), *args]
    if sys.platform.startswith("linux"):
        command = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *command]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    restrict_dvc_storage()
    if result.returncode != 0:
        raise RuntimeError(f"dvc {' '.join(args)} failed: {result.stderr.strip().splitlines()[-1:]}")


@dataclass(frozen=True)
class DvcRemote:
    """A DVC remote as .dvc/config (then config.local) names it: its URL, and its folder when it is one here."""

    name: str
    url: str
    folder: Path | None  # a folder on this machine, else None


def dvc_remotes() -> list[DvcRemote]:
    """DVC's remotes (.dvc/config, then config.local); a path without a scheme is relative to .dvc/."""
    found: dict[str, DvcRemote] = {}
    for config in (Path(".dvc/config"), Path(".dvc/config.local")):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(config.read_text() if config.is_file() else "")
        except (configparser.Error, OSError):
            continue
        for section in parser.sections():
            match = re.fullmatch(r"""'?remote\s+"(.+)"'?""", section.strip())
            if not match or "url" not in parser[section]:
                continue
            url = parser[section]["url"].strip()
            local = url.removeprefix("file://") if url.startswith("file://") or "://" not in url else None
            folder = (Path(".dvc") / local).resolve() if local is not None else None
            found[match.group(1)] = DvcRemote(match.group(1), url, folder)
    return list(found.values())


def restrict_dvc_storage() -> None:
    """Make every folder of DVC's cache and of a folder remote its owner's alone (0700). DVC writes its copies
    0444 in 0755 folders, readable by every user of the machine, while privpipe keeps the files they copy (a
    raw table, a lifetime ledger) 0600; the copies themselves keep DVC's mode, unreachable below a 0700 folder."""
    for root in [Path(".dvc/cache"), *(r.folder for r in dvc_remotes() if r.folder is not None)]:
        if not root.is_dir():
            continue
        for folder in [root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]:
            with contextlib.suppress(OSError):  # a folder of another owner (a shared remote): left as it is
                if folder.stat().st_mode & 0o077:
                    folder.chmod(0o700)
