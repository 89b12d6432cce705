"""One run asking for admission to the digits' lifetime budget, in a process of its own (the budget
race of tests/stages/privacy/test_budget_reservations.py and bench/concurrency.py).

    python tests/budget_racer.py NAME MODE      # in a project folder, with privpipe importable

Waits for the file ``go``; asks for admission; writes ``admitted-NAME`` (its reservation id) or
``refused-NAME`` (the refusal, exit 1). MODE ``charge``: holds the reservation until the file
``charge`` appears, then charges ``privacy.epsilon_budget``; ``hold``: holds it until killed;
``published``: marks it released, then holds it until killed.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from privpipe.config import load_params
from privpipe.privacy import LifetimeBudgetExceeded, RunSpend
from tasks.privacy import budget


def main(name: str, mode: str) -> int:
    params = load_params("params.yaml")
    while not Path("go").exists():
        time.sleep(0.005)
    try:
        with budget.admitted(params, "digits", what=f"run {name}", flow="pipeline") as admission:
            if mode == "published":
                admission.mark_published()
            Path(f"admitted-{name}").write_text(admission.reservation.run)
            while mode != "charge" or not Path("charge").exists():
                time.sleep(0.005)
            admission.charge(RunSpend(run=name, flow="pipeline", recorded_at=datetime.now(UTC).isoformat(),
                                      data_version="v1", epsilon=params.privacy.epsilon_budget,
                                      delta=params.privacy.delta, accountant="pld"))
    except LifetimeBudgetExceeded as exc:
        Path(f"refused-{name}").write_text(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
