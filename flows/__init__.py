"""Prefect flows that chain the stages in tasks/, and the command line."""

from flows.env import configure as _configure

_configure()
