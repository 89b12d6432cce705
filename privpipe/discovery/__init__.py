"""What a schema leaves out, found with differential privacy: numeric bounds, categories and labels.

    mechanism = DiscoveryMechanism.calibrated(epsilon=0.6, delta=1e-5, columns=30, labels=True)
    found = discover({name: count_column(cells) for name, cells in cells_by_column.items()},
                     count_column(label_cells, numbers_only=True), mechanism=mechanism,
                     bounds=make_bounds_estimator("threshold"), noise=noise)
    found.columns["mean_radius"]      # ColumnSchema(min=8.0, max=16.0)
    mechanism.event(stage="schema")   # what the ledger is charged

One noisy release (:mod:`privpipe.discovery.release`) of one histogram per column (fixed log-spaced bins for
numbers, a thresholded count per value for text: Gaussian partition selection) is post-processed by a
bounds estimator (:mod:`privpipe.discovery.bounds`, a registry like PATE's aggregators) into each
column's description. Nothing is released raw: a value no noisy count carries past its threshold
never appears in the schema.
"""

from privpipe.discovery.bins import LOG_BINS, LogBins
from privpipe.discovery.bounds import BOUNDS_ESTIMATORS, BoundsEstimator, make_bounds_estimator
from privpipe.discovery.mechanism import DiscoveryMechanism
from privpipe.discovery.release import ColumnCounts, NoisyColumn, count_column, release_column
from privpipe.discovery.schema import Discovered, discover

__all__ = ["LOG_BINS", "LogBins", "BOUNDS_ESTIMATORS", "BoundsEstimator", "make_bounds_estimator",
           "DiscoveryMechanism", "ColumnCounts", "NoisyColumn", "count_column", "release_column", "Discovered",
           "discover"]
