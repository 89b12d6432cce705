"""Serving a released model on a team's raw records: :class:`ServedModel` (the rule prepare encoded by, the
label names, the network as a graph), loaded by MLflow through :mod:`privpipe.serving.loader`."""

from privpipe.serving.served import BATCH_ROWS, ServedModel, output_columns

__all__ = ["ServedModel", "output_columns", "BATCH_ROWS", "LOADER_MODULE", "SERVED_FOLDER"]

LOADER_MODULE = "privpipe.serving.loader"  # what an MLmodel's python_function flavour names
SERVED_FOLDER = "served"  # the logged model's data folder: data/served/{input.json, classes.json, model.pt2}
