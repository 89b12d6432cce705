"""The command line's exit-code table (flows/cli/exits.py): privpipe's own bad-input exceptions end with one
line and exit 2, busy and refused runs with exit 1, a failed privacy audit with exit 3, and anything else, a bug,
with its traceback."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from conftest import PROJECT, cli
from flows.cli import main
from flows.cli.app import build_parser
from flows.cli.exits import EXITS, exit_for
from privpipe.config import ConfigError
from privpipe.data import DataError
from privpipe.privacy import BudgetExceeded, LifetimeBudgetExceeded
from privpipe.privacy.membership import PrivacyAuditFailed
from privpipe.requests import QueueBusy, QueueError, UnknownRecord
from tasks.common import PipelineBusy


def row_type(row) -> type[BaseException]:
    return getattr(importlib.import_module(row.module), row.name)


def raising(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    """`privpipe budget` raises ``exc`` as its first act."""
    def budget(args: argparse.Namespace) -> int:
        raise exc

    monkeypatch.setattr("flows.cli.history.budget", budget)


@pytest.mark.parametrize("exc, code, prefix", [
    (ConfigError("privacy.delta: must be in (0, 1)"), 2, "privpipe: error: "),
    (DataError("data/raw/x.csv: file not found"), 2, "privpipe: error: "),
    (QueueError("data/requests: line 1: not valid JSON"), 2, "privpipe: error: "),
    (UnknownRecord("record id 'x': not in the current data (nothing was queued)"), 2, "privpipe: error: "),
    (argparse.ArgumentError(None, "--since: expected a date like 2026-11-23, got 'x'"), 2, "privpipe: error: "),
    (QueueBusy("another removal run holds the lock"), 1, "privpipe: busy: "),
    (PipelineBusy("another pipeline run holds the lock"), 1, "privpipe: busy: "),
    (BudgetExceeded("dp_pca: would raise total ε past the budget"), 1, "privpipe: refused: "),
    (LifetimeBudgetExceeded("pipeline run: dataset 'digits' has spent ε = 30"), 1, "privpipe: refused: "),
    (PrivacyAuditFailed("privacy audit: the empirical ε is above the claimed one"), 3,
     "privpipe: PRIVACY AUDIT FAILED: "),
], ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else None)
def test_expected_failures_end_with_one_line_and_their_code(monkeypatch, exc, code, prefix):
    raising(monkeypatch, exc)
    assert cli("budget") == (code, "", f"{prefix}{exc}\n")


@pytest.mark.parametrize("exc", [ValueError("features must be 2-D"), FileNotFoundError("artifacts/x.json"),
                                 KeyError("accuracy_test"), RuntimeError("unexpected")], ids=repr)
def test_a_bug_propagates_in_process(monkeypatch, exc):
    raising(monkeypatch, exc)
    with pytest.raises(type(exc)) as raised:
        cli("budget")
    assert raised.value is exc


def test_a_plain_value_error_from_a_command_prints_its_traceback_and_is_not_exit_2():
    """As a user sees it: the traceback names where the bug is; exit 1 (Python's), not the bad-input code."""
    code = ("import flows.cli.history as history\n"
            "def budget(args):\n"
            "    raise ValueError('shapes (3,) and (4,) not aligned')\n"
            "history.budget = budget\n"
            "from flows.cli import main\n"
            "raise SystemExit(main(['budget']))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr and "in budget" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "ValueError: shapes (3,) and (4,) not aligned"
    assert "privpipe: error" not in done.stderr


def test_only_privpipes_own_bad_input_exceptions_give_exit_2():
    bad_input = {row_type(row) for row in EXITS if row.code == 2}
    assert bad_input == {ConfigError, DataError, QueueError, UnknownRecord, argparse.ArgumentError}
    for bug in (ValueError("x"), FileNotFoundError("x"), KeyError("x"), TypeError("x"), OSError("x")):
        assert exit_for(bug) is None


def test_every_row_names_an_exception_class_and_none_is_shadowed_by_an_earlier_one():
    """A class moved to another module would otherwise turn its one-line exit into a traceback unnoticed."""
    types = [row_type(row) for row in EXITS]
    assert all(isinstance(t, type) and issubclass(t, Exception) for t in types)
    for later, t in enumerate(types):
        assert not any(issubclass(t, earlier) for earlier in types[:later]), t


def test_help_and_a_bad_option_import_nothing_heavy():
    """`privpipe --help` and an option refused after parsing load neither the library's numerics nor
    Prefect, MLflow or torch: the exit table looks its types up in sys.modules."""
    code = ("import sys\n"
            "from flows.cli import main\n"
            "try:\n"
            "    main(['--help'])\n"
            "except SystemExit as exc:\n"
            "    assert exc.code == 0\n"
            "code = main(['privacy', 'dpsgd', '--noise-multiplier', '1', '--sample-rate', '2', '--steps', '1',\n"
            "             '--delta', '1e-5'])\n"
            "heavy = ('numpy', 'torch', 'prefect', 'mlflow', 'privpipe.config', 'privpipe.privacy')\n"
            "print(code, sorted(m for m in heavy if m in sys.modules))\n")
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "2 []"
    assert done.stderr == "privpipe: error: --sample-rate: must be in (0, 1], got 2.0\n"


def test_a_malformed_command_line_is_argparses_exit_2():
    with pytest.raises(SystemExit) as raised:
        main(["stage", "no-such-stage"])
    assert raised.value.code == 2


def test_track_is_refused_before_the_stage_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no params file: the option is refused before it would be read
    assert cli("stage", "prepare", "--track") == (2, "", "privpipe: error: --track: only the evaluate stage can "
                                                          "record a run\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["run"], ["stage", "prepare"], ["federated"], ["init-data"], ["forget", "digits-0001"], ["removals"],
    ["requests"], ["serve"], ["budget"], ["audit"],
    ["privacy", "dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "1", "--delta", "1e-5"],
], ids=lambda argv: " ".join(argv[:2]))
def test_each_command_names_a_function_that_exists(argv):
    """app.py names each command's function as text (imported only when it runs): a typo would surface only
    when a user runs that command."""
    module, function = build_parser().parse_args(argv).runs.split(":")
    assert callable(getattr(importlib.import_module(module), function))


def test_the_console_script_is_this_main():
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "privpipe"]
    assert script.value == "flows.cli:main" and script.load() is main


def test_the_command_ends_like_a_normal_exit_without_the_teardown():
    """The privpipe command leaves through os._exit (the interpreter's teardown took 2-3 s after a run),
    but first does what a normal exit does: an idle thread pool left open is shut down and its worker
    joined (joining before telling it to stop waited forever after `privpipe removals`), the atexit
    handlers run, buffered output is flushed, and the exit code is the command's."""
    code = ("import atexit, sys\n"
            "from concurrent.futures import ThreadPoolExecutor\n"
            "pool = ThreadPoolExecutor(1)\n"
            "pool.submit(print, 'work done').result()  # its worker now idles, waiting for more\n"
            "atexit.register(lambda: print('atexit ran'))\n"
            "sys.stdout.write('buffered, no newline')\n"
            "from flows.cli.dispatch import _leave\n"
            "_leave(3)\n")
    done = _python(code)
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["work done", "buffered, no newlineatexit ran"]


def _python(code: str) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter in the project folder (a hang fails after two minutes)."""
    return subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, timeout=120)
