"""``privpipe schema``: the private discovery of what ``prepare.schema`` leaves out, printed as a reviewable file.

    privpipe schema --params clinic.yaml > schema.yaml

Its ε (``schema.epsilon``, or its share of ``privacy.epsilon_budget``) is charged to the dataset's lifetime
budget before the file is printed. Set the file as ``prepare.schema`` and later runs spend nothing on it.
"""

from __future__ import annotations

import argparse
import sys

from privpipe.config import load_params

__all__ = ["schema"]


def schema(args: argparse.Namespace) -> int:
    params = load_params(args.params)
    from tasks import discovery  # deferred: numpy, scipy and the data readers, once the params are checked
    from tasks.privacy import budget
    from tasks.privacy.ledger import new_ledger

    plan = discovery.discovery_plan(params)
    if plan is None:
        print(f"{args.params}: prepare.schema declares everything {params.prepare.path} holds: nothing to discover "
              "(and nothing spent)", file=sys.stderr)
        return 0
    discovery.check_sources(params, plan)  # what can be refused before the draw, refused uncharged
    dataset = budget.dataset_name(params)
    with budget.admitted(params, dataset, what="schema discovery", flow="schema") as admission:
        planned = discovery.mechanism_for(params, plan).event(stage="schema")
        spend = budget.planned_cost(params, planned, record_level=True, unit="release")
        admission.resize(epsilon=spend[0], delta=spend[1], basis=spend[2], before="the discovery")
        admission.mark_published()  # from the draw on: a refusal that follows it (too few labels) says something
        release = discovery.discover_schema(params, withheld=discovery.withheld_records(params))
        assert release is not None  # the plan said something is missing
        text = discovery.schema_yaml(release, dataset=dataset, delta=params.privacy.delta)
        admission.charge(budget.spend_of_run(run_id=admission.reservation.run, flow="schema", data_version="",
                                             ledger=new_ledger(params, events=[release.event])))
    sys.stdout.write(text)
    print(f"schema: discovered at ε = {release.epsilon:.4g}, δ = {params.privacy.delta:g}, charged to the lifetime "
          f"budget of dataset {dataset!r} ({budget.ledger_path(params, dataset)})", file=sys.stderr)
    return 0
