"""Write scikit-learn's breast cancer data as a clinic would export it, for the worked example in the README
("Your own data"):

    .venv/bin/python examples/breast_cancer.py            # writes data/raw/patients.csv (569 rows)
    .venv/bin/privpipe run --params examples/params-breast-cancer.yaml

Header ``patient_id,mean_radius,...,worst_fractal_dimension,diagnosis``; ids ``P0000``...; the diagnosis as a
word (``malignant``/``benign``). The data ships with scikit-learn: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path

__all__ = ["column_name", "write_patients_csv"]

LABELS = ("malignant", "benign")  # scikit-learn's target 0, 1


def column_name(feature: str) -> str:
    """A natural CSV header name: ``mean radius`` → ``mean_radius``."""
    return re.sub(r"[^0-9a-z]+", "_", feature.lower()).strip("_")


def write_patients_csv(path: Path) -> int:
    """The table at ``path``; returns the number of rows written."""
    from sklearn.datasets import load_breast_cancer  # deferred: sklearn.datasets takes seconds

    data = load_breast_cancer()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["patient_id", *(column_name(str(f)) for f in data.feature_names), "diagnosis"])
        for i, (row, target) in enumerate(zip(data.data, data.target)):
            writer.writerow([f"P{i:04d}", *(f"{value:g}" for value in row), LABELS[target]])
    return len(data.target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/raw/patients.csv"), help="the CSV to write")
    args = parser.parse_args()
    rows = write_patients_csv(args.out)
    print(f"{args.out}: {rows} patients")


if __name__ == "__main__":
    main()
