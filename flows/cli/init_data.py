"""``privpipe init-data``: write the embedded default dataset (digits) under data/raw if missing."""

from __future__ import annotations

import argparse

from privpipe.config import load_params
from tasks.source import ensure_default_data

__all__ = ["init_data"]


def init_data(args: argparse.Namespace) -> int:
    params = load_params(args.params)
    written = ensure_default_data(params)
    print(f"{params.prepare.path}: {'written from scikit-learn' if written else 'present'}")
    return 0
