"""Which dataset, and which version of its data, each artifact was made from: ``identity.json`` in its folder.

prepare stamps the prepared sets with the dataset's name, its source (``prepare.path``) and the data
version it wrote; every later stage stamps its output with the stamp of what it read, and checks,
before any work, that what it reads was made from the dataset the params name, all from one data
version. A removal run checks the head's dataset the same way (its data version moves on with each
erasure, so only the dataset is compared there): a deletion request never edits another dataset's model.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from privpipe.data import DataError
from tasks.paths import dataset_name

if TYPE_CHECKING:  # a type only: the stamp stays importable without privpipe.config
    from privpipe.config import Params

__all__ = ["MadeFrom", "STAMP", "stamp", "read_stamp", "params_dataset", "check_inputs", "check_dataset"]

STAMP = "identity.json"


@dataclass(frozen=True)
class MadeFrom:
    """The data an artifact was made from."""

    dataset: str  # the dataset's name (tasks.paths.dataset_name)
    source: str  # its raw data's file or folder, prepare.path as the params name it (normalised)
    data_version: str  # the prepared sets' version (tasks.versioning.data_version, with erasure suffixes)

    def describe(self) -> str:
        return f"dataset {self.dataset} ({self.source})"


def params_dataset(params: Params) -> tuple[str, str]:
    """(name, source) of the dataset the params name."""
    return dataset_name(params), os.path.normpath(params.prepare.path)


def stamp(folder: Path, made_from: MadeFrom) -> None:
    """Write the stamp into ``folder`` (a staging folder, before it is put in place)."""
    (Path(folder) / STAMP).write_text(json.dumps(asdict(made_from), indent=2, sort_keys=True) + "\n")


def read_stamp(folder: Path) -> MadeFrom | None:
    """The folder's stamp; None without one; DataError naming the file when it cannot be read."""
    path = Path(folder) / STAMP
    try:
        raw = json.loads(path.read_text())
        return MadeFrom(dataset=str(raw["dataset"]), source=str(raw["source"]), data_version=str(raw["data_version"]))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        raise DataError(f"{path}: damaged (expected dataset, source and data_version); rerun the stage that "
                        "wrote it") from None


def _required(folder: Path, *, stage: str = "earlier stages") -> MadeFrom:
    made_from = read_stamp(folder)
    if made_from is None:
        if not Path(folder).exists():
            raise DataError(f"{folder}: missing (run the {stage} first)")
        raise DataError(f"{Path(folder) / STAMP}: missing, so what {folder} was made from is unknown; rerun the "
                        "stage that writes it")
    return made_from


def check_dataset(params: Params, folder: Path, *, stage: str = "earlier stages") -> MadeFrom:
    """The folder's stamp, when it names the dataset the params name; else DataError in one line (``stage``:
    what to run when the folder is missing)."""
    made_from = _required(folder, stage=stage)
    name, source = params_dataset(params)
    if (made_from.dataset, made_from.source) != (name, source):
        raise DataError(f"{folder}: made from {made_from.describe()}, not dataset {name} ({source}) that the "
                        "params name; nothing was changed")
    return made_from


def check_inputs(params: Params, prepared: Path, *folders: Path) -> MadeFrom:
    """Before a stage's work: the prepared sets are of the params' dataset, and each of ``folders`` (the
    artifacts the stage reads) was made from those same prepared sets, not an earlier data version."""
    made_from = check_dataset(params, prepared, stage="prepare stage")
    for folder in folders:
        other = _required(folder)
        if other != made_from:
            what = (f"data version {other.data_version}, not {made_from.data_version} of {prepared}"
                    if other.dataset == made_from.dataset and other.source == made_from.source
                    else f"{other.describe()}, not {made_from.describe()} of {prepared}")
            raise DataError(f"{folder}: made from {what}; rerun the stages from the one that writes it")
    return made_from
