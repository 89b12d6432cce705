"""What each removal mechanism of a deletion request means, in words: the audit record's and
``privpipe requests``' legend (a module of its own, so the CLI's table does not import the removal flow)."""

from __future__ import annotations

__all__ = ["MECHANISMS"]

MECHANISMS = {
    "newton": "Newton-update removal (Guo et al. 2020), gradient residual within the certified-removal budget",
    "retrain": "head retrained from scratch without the record, fresh loss perturbation (exact removal)",
    "absent": "not in the head's training rows (a public, target, test or text record, one an earlier request "
              "removed, or one left out or removed by the pipeline run it was requested during); the coverage "
              "list says how every model version that used it covers it",
    "no_head": "no removal-enabled head in this project (head.enabled is false, or no head trained): nothing to "
               "update; the coverage list says how every model version that used the record covers it",
}
