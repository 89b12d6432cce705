"""The ``privpipe`` command line (the console script ``privpipe = flows.cli:main``).

app.py registers the commands and their options; dispatch.py runs one and applies exits.py, the
table of exit codes; each command's pre-run checks and report live in the module app.py names.
"""

from flows.cli.dispatch import main

__all__ = ["main"]
