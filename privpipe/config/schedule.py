"""schedule: the Prefect deployments of ``privpipe serve`` (retraining, deletion processing)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from privpipe.config.cron import is_cron
from privpipe.config.errors import require
from privpipe.config.urls import redact_url


@dataclass(frozen=True)
class ScheduleConfig:
    #: the training pipeline: Sundays 03:00
    retrain_cron: str = "0 3 * * 0"  # each retrain spends the lifetime budget (ten runs at the defaults)
    #: deletion processing, and also at once on each `privpipe forget` (a Prefect event)
    removals_cron: str = "*/30 * * * *"  # a backstop: each `privpipe forget` also triggers a run at once
    #: the time zone the cron schedules are read in (IANA name)
    timezone: str = "UTC"
    #: the Prefect server `privpipe serve` starts (127.0.0.1 only; UI at the same port, log in .prefect/server.log) or
    #: uses if it is this project's; `forget` notifies it
    prefect_api_url: str = "http://127.0.0.1:4200/api"  # the server `privpipe serve` starts, on this machine only


def check(schedule: ScheduleConfig) -> None:
    for key in ("retrain_cron", "removals_cron"):
        require(is_cron(getattr(schedule, key)), f"schedule.{key}",
                f"not a cron expression (five fields, e.g. '0 3 * * 0'): {getattr(schedule, key)!r}")
    require(_is_timezone(schedule.timezone), "schedule.timezone",
            f"unknown time zone {schedule.timezone!r} (an IANA name such as UTC or Europe/Berlin)")
    require(schedule.prefect_api_url.startswith(("http://", "https://")), "schedule.prefect_api_url",
            "must be an http(s) URL")
    require(urlsplit(schedule.prefect_api_url).path.rstrip("/").endswith("/api"), "schedule.prefect_api_url",
            f"must be a Prefect server's API address, ending in /api (e.g. http://127.0.0.1:4200/api): "
            f"{redact_url(schedule.prefect_api_url)!r}")


def _is_timezone(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True
