"""``privpipe predict``: score a table or an image folder with a registered model, raw records in, label names
and class probabilities out (tasks/serving/batch.py).

    privpipe predict --model privpipe-breast-cancer/3 --input new_patients.csv --output scored.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from privpipe.config import load_params

__all__ = ["predict"]


def predict(args: argparse.Namespace) -> int:
    params = load_params(args.params)  # the registry it names: run.tracking_uri
    from tasks.serving.batch import check_paths, score_file  # deferred: pandas, torch and MLflow, once the params hold

    source, target = Path(args.input), Path(args.output)
    check_paths(source, target)
    version, rows = score_file(params, name=args.model.name, version=args.model.version, source=source, target=target)
    print(f"predict: {rows} rows of {source} scored by {version} into {target}", file=sys.stderr)
    return 0
