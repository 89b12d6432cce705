"""The prepared data as the later stages read it: :class:`PreparedSets`, the prepare stage's output
(data/prepared/<dataset>/<set>/ and metrics/<dataset>/prepare.json).

Kept apart from the stage itself (tasks/prepare.py), so that a stage that reads the sets depends on
their format, not on the code that loads and splits the raw data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from privpipe.data.raw_input import RecordInput, input_from_json
from privpipe.data.shape import DataShape
from tasks.common import read_json, write_json
from tasks.paths import DatasetPaths

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.tracking import TrackedRun

__all__ = ["PreparedSets", "read_shape", "write_shape", "SHAPE_FILE", "read_input", "write_input", "INPUT_FILE"]

STAGE = "prepare"
SHAPE_FILE = "shape.json"  # beside the sets: their records' shape and the public label set
INPUT_FILE = "input.json"  # beside them: how a raw record became one (what a served model applies)


def write_shape(folder: Path, shape: DataShape) -> None:
    write_json(Path(folder) / SHAPE_FILE, shape.to_json())


def write_input(folder: Path, rule: RecordInput) -> None:
    write_json(Path(folder) / INPUT_FILE, rule.to_json())


def read_input(folder: Path) -> RecordInput:
    """The rule the prepared records were encoded by (public: the schema's, or the image kind's)."""
    return input_from_json(read_json(Path(folder) / INPUT_FILE))


def read_shape(folder: Path) -> DataShape:
    """The prepared records' shape and label set (public: from the data's declaration, not its records)."""
    return DataShape.from_json(read_json(Path(folder) / SHAPE_FILE))


@dataclass(frozen=True)
class PreparedSets:
    """The sets prepare wrote under ``folder`` (one sub-folder each), their public counts and the data version.

    ``sizes`` has every set written, in the order written: sensitive, test, public, and target and
    target_test when prepare made a target domain."""

    where: DatasetPaths  # the dataset's folders: the sets are under where.prepared
    sizes: Mapping[str, int]
    n_erased: int  # completed deletion requests
    n_withheld_pending: int  # requests not yet done, already left out
    n_features: int
    n_classes: int
    data_version: str
    source: str  # the raw data's file or folder (prepare.path), as the run's dataset input names it
    shape: DataShape  # the records' shape and the public label set (shape.json)
    schema_epsilon: float = 0.0  # what the schema stage spent inside prepare (0: the schema was declared)

    @property
    def folder(self) -> Path:
        return self.where.prepared

    def path(self, name: str) -> Path:
        return self.folder / name

    @property
    def sensitive(self) -> Path:
        return self.path("sensitive")

    @property
    def test(self) -> Path:
        return self.path("test")

    @property
    def public(self) -> Path:
        return self.path("public")

    @property
    def has_target(self) -> bool:
        return "target" in self.sizes

    def metrics(self) -> dict[str, int | float | str]:
        """metrics/prepare.json (public counts and the data version)."""
        out: dict[str, int | float | str] = {f"n_{name}": size for name, size in self.sizes.items()}
        out.update({"n_erased": self.n_erased, "n_withheld_pending": self.n_withheld_pending,
                    "n_features": self.n_features, "data_version": self.data_version, "n_classes": self.n_classes})
        if self.schema_epsilon:
            out["schema_epsilon"] = self.schema_epsilon
        return out

    def write_metrics(self) -> None:
        write_json(self.where.metrics_file(STAGE), self.metrics())

    @classmethod
    def read(cls, *, source: str, where: DatasetPaths) -> PreparedSets:
        """The last prepare's output, from its metrics file (what ``privpipe stage evaluate --track`` records)."""
        figures = read_json(where.metrics_file(STAGE))
        named = ("n_erased", "n_withheld_pending", "n_features", "n_classes")
        sizes = {k.removeprefix("n_"): int(v) for k, v in figures.items()
                 if k.startswith("n_") and k not in named}
        return cls(where=where, sizes=sizes, n_erased=figures["n_erased"],
                   n_withheld_pending=figures["n_withheld_pending"], n_features=figures["n_features"],
                   n_classes=figures["n_classes"], data_version=figures["data_version"], source=source,
                   shape=read_shape(where.prepared), schema_epsilon=float(figures.get("schema_epsilon", 0.0)))

    def log(self, run: TrackedRun) -> None:
        """MLflow: the dataset input and data version, and the counts as ``data.n_*`` tags."""
        run.log_data_input(data_version=self.data_version, source=self.source)
        run.log_figures({f"data.{k}": float(v) for k, v in self.metrics().items() if k.startswith("n_")})
        schema = self.folder / "schema.yaml"
        if schema.is_file():  # the discovered schema: public (a DP release), for review beside the run
            run.log_text(schema.read_text(), "schema/schema.yaml")
