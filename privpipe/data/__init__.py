"""Datasets: loading from local files in standard formats, splitting, storing."""

from privpipe.data.digits import export_digits_csv, load_labeled_csv
from privpipe.data.mnist import load_mnist, read_idx
from privpipe.data.records import UNLABELED, DataError, Records, check_label_counts, check_labels
from privpipe.data.shape import DataShape
from privpipe.data.split import assign_sets, keyed_uniforms, split_by_shares, subsample

__all__ = [
    "Records",
    "UNLABELED",
    "DataShape",
    "check_labels",
    "check_label_counts",
    "DataError",
    "export_digits_csv",
    "load_labeled_csv",
    "load_mnist",
    "read_idx",
    "assign_sets",
    "keyed_uniforms",
    "split_by_shares",
    "subsample",
]
