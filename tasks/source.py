"""The raw data's source file: the embedded default written on first use, or a later version from DVC.

The digits CSV is written byte-identically from scikit-learn's copy, so a fresh clone needs no
download while ``data/raw/digits.csv.dvc`` names those bytes. After an erasure the pointer names a
later version (records removed) that only DVC has: then the file comes from DVC's cache or remote,
never from scikit-learn, which would bring the erased records back.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from privpipe.config import Params
from privpipe.data import DataError, export_digits_csv
from privpipe.data.digits import EMBEDDED_DIGITS_MD5
from tasks import paths
from tasks.versioning import dvc

__all__ = ["ensure_default_data"]


def _pointer_md5(pointer: Path) -> str | None:
    """The md5 a DVC pointer file names (None when there is no pointer)."""
    try:
        outs = yaml.safe_load(pointer.read_text())["outs"]
        return str(outs[0]["md5"])
    except FileNotFoundError:
        return None
    except (yaml.YAMLError, KeyError, IndexError, TypeError):
        raise DataError(f"{pointer}: not a DVC pointer file (expected outs: - md5: …)") from None


def ensure_default_data(params: Params) -> bool:
    """Write the embedded default (digits CSV) if params use it and it is missing; True if written."""
    source = Path(params.prepare.path)
    if not params.prepare.kind.embedded or source != paths.DEFAULT_DIGITS_CSV or source.exists():
        return False
    pointer = source.with_name(source.name + ".dvc")
    version = _pointer_md5(pointer)
    if version in (None, EMBEDDED_DIGITS_MD5):
        export_digits_csv(source)
        return True
    for command in (("checkout", "--quiet", str(pointer)), ("pull", "--quiet", str(pointer))):
        try:
            dvc(*command)
        except RuntimeError:
            continue
        if source.exists():
            return True
    raise DataError(f"{pointer}: names data version {version}, not the embedded default, and neither DVC's "
                    f"cache nor its remote has it; `dvc pull {pointer}` where it was pushed (privpipe never "
                    "rewrites a later version from scikit-learn: its erased records would come back)")
