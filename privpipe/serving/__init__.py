"""Serving a released model on a team's raw records: :class:`ServedModel` (the rule prepare encoded by, the
label names, the network as a graph), loaded by MLflow through tasks.serving.loader."""

from privpipe.serving.served import BATCH_ROWS, ServedModel, output_columns

__all__ = ["ServedModel", "output_columns", "BATCH_ROWS", "SERVED_FOLDER"]

SERVED_FOLDER = "served"  # the logged model's data folder: data/served/{input.json, classes.json, model.pt2}
