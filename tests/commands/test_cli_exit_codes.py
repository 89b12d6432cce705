"""The command line's exit-code table (flows/cli/exits.py): privpipe's own bad-input exceptions end with one
line and exit 2, busy and refused runs with exit 1, a failed privacy audit with exit 3, and anything else, a bug,
with its traceback."""

from __future__ import annotations

import argparse
import ast
import atexit
import importlib
import os
import signal
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


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser under it (``privpipe privacy dpsgd`` included)."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


def test_every_parsers_error_starts_privpipe_error(capsys):
    """Issue 35: a subcommand's argparse error started with its own name (``privpipe privacy dpsgd: error: …``);
    every one starts ``privpipe: error: `` like the rest, its usage before it, exit 2."""
    parsers = _parsers(build_parser())
    assert {p.prog for p in parsers} >= {"privpipe", "privpipe forget", "privpipe privacy dpsgd"}
    for parser in parsers:
        with pytest.raises(SystemExit) as raised:
            parser.error("argument --steps: must be >= 1, got 0")
        assert raised.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"usage: {parser.prog}") and \
            err.splitlines()[-1] == "privpipe: error: argument --steps: must be >= 1, got 0", (parser.prog, err)


def test_long_values_are_cut_in_the_error_line():
    """Issue 35: a 120 KB record id was echoed whole; a value is cut to 80 characters, an ellipsis and its length,
    quoted or not, and the rest of the line kept."""
    from flows.cli.exits import clip_values

    long_id = "digits-" + "7" * 120_000
    assert clip_values(f"record id {long_id!r}: not in the current data (nothing was queued)") == \
        f"record id {long_id[:80]!r}"[:-1] + "…' (120007 characters): not in the current data (nothing was queued)"
    assert clip_values(f"finetune.{'k' * 300}: unknown key") == f"finetune.{'k' * 71}… (309 characters): unknown key"
    short = "the head's files: record id 'digits-0001' and " + repr("x" * 80) + " stay as they were"
    assert clip_values(short) == short
    path = "/tmp/" + "/".join(["folder"] * 30)  # 214 characters: a path deep in a temporary folder, whole
    assert clip_values(f"{path}: not found") == f"{path}: not found"
    with_quotes = repr("it's \"x\" " * 40)
    cut = f"{with_quotes[:81]}…{with_quotes[-1]} ({len(with_quotes) - 2} characters)"  # escapes and all
    assert clip_values(f"value {with_quotes}.") == f"value {cut}."


@pytest.mark.parametrize("exc, said", [
    (UnknownRecord(f"record id {'r' * 5000!r}: not in the current data"),
     f"privpipe: error: record id '{'r' * 80}…' (5000 characters): not in the current data\n"),
    (ConfigError(f"prepare.dataset: unknown value {'d' * 5000!r}"),
     f"privpipe: error: prepare.dataset: unknown value '{'d' * 80}…' (5000 characters)\n"),
], ids=["UnknownRecord", "ConfigError"])
def test_the_error_line_cuts_long_values(monkeypatch, exc, said):
    raising(monkeypatch, exc)
    assert cli("budget") == (2, "", said)


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


#: a stand-in for a run, as `privpipe budget`: what a normal exit must still finish (an idle thread pool left
#: open, an atexit handler registered during the command as Prefect's server stop is, a log record held in
#: memory by a handler set up before main, output without a newline), and an object whose finaliser runs only
#: in the interpreter's teardown
RUN_THEN_EXIT = """\
import atexit, logging, logging.handlers, sys
from concurrent.futures import ThreadPoolExecutor
import flows.cli.history as history

class Teardown:
    def __del__(self, _open=open):
        _open({marker!r}, "w").close()

log = logging.getLogger("late")
log.addHandler(logging.handlers.MemoryHandler(100, target=logging.StreamHandler(sys.stderr)))

def budget(args):
    pool = ThreadPoolExecutor(1)
    pool.submit(print, "work done").result()  # its worker now idles, waiting for more
    atexit.register(lambda: print("atexit ran"))
    history.kept = Teardown()
    log.warning("logged, held in memory")
    sys.stdout.write("buffered, no newline")
    return 3

history.budget = budget
sys.argv[1:] = ["budget"]
from flows.cli import main
sys.exit({call})
"""


@pytest.mark.parametrize("call, teardown", [("main()", False), ("main(['budget'])", True)],
                         ids=["as the command", "called with argv"])
def test_the_command_ends_like_a_normal_exit_without_the_teardown(tmp_path, call, teardown):
    """The privpipe command skips the interpreter's teardown (2-3 s after a run), but first does what a normal
    exit does: an idle thread pool left open is shut down and its worker joined (joining before telling it to
    stop waited forever after `privpipe removals`), the atexit handlers run, logging's buffers and stdout are
    flushed, and the exit code is the command's. main called with argv (a test, a script) exits normally."""
    marker = tmp_path / "teardown ran"
    done = _python(RUN_THEN_EXIT.format(marker=str(marker), call=call))
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["work done", "buffered, no newlineatexit ran"]
    assert done.stderr == "logged, held in memory\n"
    assert marker.exists() == teardown


def test_a_broken_pipe_at_the_exit_is_not_an_error():
    """`privpipe … | head -1`: output still buffered when the reader has gone is dropped quietly, with the
    command's exit code (a normal exit says 'Exception ignored … BrokenPipeError' and exits 120)."""
    code = ("import os, sys\n"
            "read, write = os.pipe()\n"
            "os.dup2(write, 1); os.close(read); os.close(write)  # stdout: a pipe nobody reads any more\n"
            "import flows.cli.history as history\n"
            "def budget(args):\n"
            "    sys.stdout.write('x' * 100)\n"
            "    return 0\n"
            "history.budget = budget\n"
            "sys.argv[1:] = ['budget']\n"
            "from flows.cli import main\n"
            "sys.exit(main())\n")
    done = _python(code)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize("raised, code, said", [
    ("ValueError('shapes (3,) and (4,) not aligned')", 1, "ValueError: shapes (3,) and (4,) not aligned"),
    ("SystemExit(4)", 4, ""),
    ("KeyboardInterrupt()", -signal.SIGINT, "KeyboardInterrupt"),
], ids=["a bug", "an exit of its own", "ctrl-c"])
def test_a_command_that_raises_leaves_through_the_normal_exit(raised, code, said):
    """Only a command that returns skips the teardown: a bug's traceback and exit 1, a SystemExit's own code
    and Ctrl-C's death by SIGINT are the interpreter's, as before."""
    snippet = ("import sys\n"
               "import flows.cli.history as history\n"
               "def budget(args):\n"
               f"    raise {raised}\n"
               "history.budget = budget\n"
               "sys.argv[1:] = ['budget']\n"
               "from flows.cli import main\n"
               "sys.exit(main())\n")
    done = _python(snippet)
    assert done.returncode == code, done.stderr
    assert (done.stderr.strip().splitlines() or [""])[-1] == said


def test_help_and_a_refused_option_as_the_command():
    """argparse's own exit (--help: 0) passes through; a refusal main returns (2) is the exit code."""
    done = subprocess.run([sys.executable, "-m", "flows.cli", "--help"], cwd=PROJECT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: ")
    done = subprocess.run([sys.executable, "-m", "flows.cli", "privacy", "dpsgd", "--noise-multiplier", "1",
                           "--sample-rate", "2", "--steps", "1", "--delta", "1e-5"], cwd=PROJECT,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (2, "privpipe: error: --sample-rate: must be in (0, 1], got 2.0\n")


def test_the_cli_calls_no_private_python_function():
    """The exit called CPython's private threading._shutdown and atexit._run_exitfuncs; it now calls atexit's
    public register and os._exit (public, documented) only. A call of any ``module._name`` in flows/cli/ fails
    here (app.py's annotation with argparse._SubParsersAction is no call)."""
    private = []
    for path in sorted((PROJECT / "flows" / "cli").glob("*.py")):
        tree = ast.parse(path.read_text())
        modules = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for alias in node.names}
        called = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)]
        private += [f"{path.name}:{f.lineno}: {f.value.id}.{f.attr}" for f in called
                    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in modules
                    and f.attr.startswith("_") and not f.attr.startswith("__")
                    and f"{f.value.id}.{f.attr}" != "os._exit"]
    assert private == []


@pytest.mark.skipif(not hasattr(atexit, "_ncallbacks"), reason="counts atexit slots with CPython's private helper")
def test_before_main_only_logging_has_an_atexit_handler():
    """The command's exit handler runs after every handler registered after it, and skips any registered before
    main; the only one there is logging's (flows.cli.dispatch imports logging), which the handler runs itself."""
    count = "import atexit\n{}\nprint(atexit._ncallbacks())\n"
    assert _python(count.format("import logging")).stdout == "1\n"
    assert _python(count.format("import flows.cli")).stdout == "1\n"


def _python(code: str) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter in the project folder (a hang fails after two minutes), its stdout
    block-buffered into the pipe as a user's is (PYTHONUNBUFFERED, if set here, would hide a lost flush)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, timeout=120,
                          env=env)
