"""The exit-code policy: which exceptions end a command with one line on stderr, and with which code.

Anything not in the table is a bug and propagates with its traceback: a plain ValueError, KeyError or
FileNotFoundError is never taken for bad input. Each type is named by its module and looked up in
sys.modules, not imported: where its module was never imported nothing can have raised it (a typo in
the params file never loads privpipe.privacy, which imports torch, seconds), and ``privpipe --help``
imports none of them.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

__all__ = ["Exit", "EXITS", "exit_for", "clip_values", "SHOWN", "LONGEST_WORD"]

BUSY, ERROR, REFUSED = "privpipe: busy: ", "privpipe: error: ", "privpipe: refused: "

#: the most characters of one value an error line shows; a longer one is cut there and its length said
SHOWN = 80
#: an unquoted word (a path, a number) is cut from this length on: a path deep in a temporary folder is shown whole
LONGEST_WORD = 256
# a value as a message quotes it (repr: '…' or "…", backslash escapes inside), opened after no letter or
# digit (an apostrophe in "the head's" opens nothing); else a run of characters with no space in it
_QUOTED = re.compile(r"""(?<!\w)(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")""")
_LONG_WORD = re.compile(rf"\S{{{LONGEST_WORD + 1},}}")


@dataclass(frozen=True)
class Exit:
    """One row: an exception of type ``module.name`` ends the command with ``prefix`` + its message and ``code``."""

    module: str  # where the exception type is defined or re-exported
    name: str
    code: int
    prefix: str  # what stderr's one line starts with, before the exception's message

    def matches(self, exc: BaseException) -> bool:
        loaded = sys.modules.get(self.module)
        return loaded is not None and isinstance(exc, getattr(loaded, self.name))


#: checked in order; the first match decides
EXITS: tuple[Exit, ...] = (
    # another run holds the lock: try again later
    Exit("privpipe.requests", "QueueBusy", 1, BUSY),
    Exit("tasks.common", "PipelineBusy", 1, BUSY),
    # bad input, refused before any work: the message names the key or file
    Exit("privpipe.config", "ConfigError", 2, ERROR),
    Exit("privpipe.data", "DataError", 2, ERROR),
    Exit("privpipe.requests", "QueueError", 2, ERROR),
    Exit("privpipe.requests", "UnknownRecord", 2, ERROR),
    Exit("argparse", "ArgumentError", 2, ERROR),  # an option's value found wrong after parsing
    # the privacy budget would be exceeded: refused before spending
    Exit("privpipe.privacy", "BudgetExceeded", 1, REFUSED),
    # a model that used a record erased while its run went on, without any guarantee: not registered
    Exit("tasks.removal.coverage", "ErasedDuringRun", 1, REFUSED),
    # `privpipe serve`: not this project's Prefect server (a subclass of the next), or none could start
    Exit("flows.deploy", "ForeignPrefectServer", 1, REFUSED),
    Exit("flows.deploy", "PrefectServerError", 1, ERROR),
    # the empirical ε contradicts the claimed one: a bug, and the model was not released
    Exit("privpipe.privacy.membership", "PrivacyAuditFailed", 3, "privpipe: PRIVACY AUDIT FAILED: "),
)


def clip_values(message: str) -> str:
    """``message`` with every value longer than :data:`SHOWN` characters cut to its first ones, an ellipsis
    and its length: ``record id 'digits-000…' (120000 characters): not in the current data``.

    The one place every error line passes through (dispatch.py, and argparse's errors in app.py), so a
    value given on the command line, in the params file or in a data file is never echoed whole, however
    the message quoted it. A quoted value keeps its quotes; a long unquoted word (a number, a path) is cut
    (from :data:`LONGEST_WORD` characters on) to its first :data:`SHOWN`."""
    def quoted(match: re.Match[str]) -> str:
        text = match.group()
        if len(text) <= SHOWN + 2:
            return text
        return f"{text[:SHOWN + 1]}…{text[-1]} ({len(text) - 2} characters)"

    def word(match: re.Match[str]) -> str:
        text = match.group().rstrip(":;,.)]") or match.group()  # the punctuation after it kept: ``x… (…): …``
        return f"{text[:SHOWN]}… ({len(text)} characters){match.group()[len(text):]}"

    parts, last = [], 0
    for match in _QUOTED.finditer(message):  # the quoted values first, the words between them after
        parts += [_LONG_WORD.sub(word, message[last:match.start()]), quoted(match)]
        last = match.end()
    return "".join([*parts, _LONG_WORD.sub(word, message[last:])])


def exit_for(exc: BaseException) -> Exit | None:
    """The table's first row that ``exc`` matches; None: not an expected outcome, let it propagate."""
    return next((row for row in EXITS if row.matches(exc)), None)
