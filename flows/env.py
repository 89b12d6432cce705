"""Offline, project-local defaults for Prefect, MLflow and DVC (set before they are imported).

Each is a default: a user's own environment variable wins.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULTS = {
    # Prefect: a temporary local API server per process, state under the project folder
    "PREFECT_HOME": str(Path(".prefect").resolve()),
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
    # mapped tasks (250 teachers) run this many at a time, not all at once: one per core
    "PREFECT_TASK_RUNNER_THREAD_POOL_MAX_WORKERS": str(os.cpu_count() or 1),
    # MLflow and DVC: no telemetry, nothing leaves the machine
    "MLFLOW_DISABLE_TELEMETRY": "true",
    # its "Downloading artifacts" bars (logging a model) would land between the stages' log lines
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "DO_NOT_TRACK": "true",
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
}


def configure() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
