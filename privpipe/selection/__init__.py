"""Private selection among training runs: random stopping (Papernot & Steinke 2022; Liu & Talwar 2019).

    selector = make_selector("logarithmic", mean_runs=4.0)
    runs = selector.draw_runs(noise)                 # K, secret: drawn like the noise
    selector.rdp(run_rdp)                            # the selection's RDP curve from one run's

Repeating a private run a random number of times and releasing only the best is private at a cost that
does not grow with the number of runs, only with log E[K]: the analysis is in :mod:`privpipe.selection.selectors`.
"""

from privpipe.selection.selectors import SELECTORS, Selector, make_selector
from privpipe.selection.stopping import TruncatedNegativeBinomial

__all__ = ["SELECTORS", "Selector", "make_selector", "TruncatedNegativeBinomial"]
