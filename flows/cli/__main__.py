"""``python -m flows.cli ARGS``: the same as ``privpipe ARGS``."""

import sys

from flows.cli.dispatch import main

sys.exit(main())
