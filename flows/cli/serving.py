"""``privpipe serve``: the Prefect deployments (scheduled retraining, deletion processing), served
until Ctrl-C; ``--list`` only describes them."""

from __future__ import annotations

import argparse

from privpipe.config import load_params

__all__ = ["serve"]


def serve(args: argparse.Namespace) -> int:
    params = load_params(args.params)
    # deferred until the params are known good: Prefect takes seconds to import
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.deploy import (
        build_deployments,
        cancel_missed_runs,
        crash_orphaned_runs,
        describe_deployment,
        prefect_server,
        serve_deployments,
    )
    from flows.notify import serving_at

    if args.list:
        for deployment in build_deployments(params, params_file=args.params):
            print(describe_deployment(deployment))
        return 0

    url = params.schedule.prefect_api_url
    # a foreign or failing Prefect server raises ForeignPrefectServer or PrefectServerError: exits.py's exit 1
    with prefect_server(url, use_running=args.use_running_server) as server, \
            temporary_settings(updates={PREFECT_API_URL: url}):
        print(f"{server.describe()}; Ctrl-C stops serving", flush=True)
        deployments = build_deployments(params, params_file=args.params)
        # runs interrupted when the server last stopped would block their deployment for good; runs that
        # came due while nothing served them would all run back to back
        orphans = crash_orphaned_runs(deployments) if server.started else []
        for line in orphans + cancel_missed_runs(deployments):
            print(line, flush=True)
        with serving_at(url):  # `privpipe forget` notifies this project's serve wherever it listens
            serve_deployments(params, params_file=args.params)
    return 0
