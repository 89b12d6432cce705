"""Lines that `privpipe run` and `privpipe federated` both print once their flow has finished."""

from __future__ import annotations

import sys
from typing import Any

from flows.runner import wait_until_recorded

__all__ = ["print_audit", "let_prefect_record"]


def print_audit(audit: dict[str, Any]) -> None:
    """The membership audit's line (see tasks.privacy.membership_audit); nothing when it was off."""
    if "privacy.audit.epsilon_lower_bound" in audit:
        aucs = ", ".join(f"{audit[f'privacy.audit.{name}.auc']:.3f} ({name})" for name in ("loss", "calibrated")
                         if f"privacy.audit.{name}.auc" in audit)
        bound, ceiling = audit["privacy.audit.epsilon_lower_bound"], audit["privacy.audit.max_provable_epsilon"]
        verdict = ("within the claimed ε" if bound <= audit["claimed_epsilon"] else "ABOVE the claimed ε (see the log)")
        print(f"privacy audit   membership AUC {aucs}; empirical ε ≥ {bound:.3f}, {verdict} "
              f"(at most {ceiling:.2f} provable with {audit['privacy.audit.members']:.0f} records a side)")
    elif audit:
        print(f"privacy audit   skipped: {audit['skipped']}")


def let_prefect_record(flow_run_id: str) -> None:
    """The temporary Prefect server stops when this process ends: first let it record every task run."""
    if not wait_until_recorded(flow_run_id):
        print("note            the temporary Prefect server had not recorded every task run's final state after "
              "120 s; the run itself is complete (MLflow and the files above)", file=sys.stderr)
