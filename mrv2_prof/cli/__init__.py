"""The ``mrv2-prof`` command line. Bad input ends with one line on stderr and exit code 2.

Exit codes of ``run``: 0 every run completed (or was stopped with ``q``), 1 a run started and
failed, 2 bad input (scenario, overrides, trace, checkpoint, database; no run row is written),
130 interrupted with Ctrl-C. ``--help`` is laid out by ``cli.help_text``. Every command, through
``main_entry``: 141 when stdout is a pipe closed early (``| head``), 1 with one line when stdout
cannot be written (a full disk) or on an unexpected error.

One module per group of commands: ``run`` (a scenario, live), ``stored`` (runs, show),
``compare``, ``gate``, ``views`` (report, export, tui, nsys import) and ``fetch`` (a shipped
real model); they are
registered here, in the order ``--help`` lists them.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
from collections.abc import Iterable
from typing import NoReturn

import typer
from typer._click import exceptions as _click_exceptions

from mrv2_prof.cli.baseline import baseline_app
from mrv2_prof.cli.compare import compare
from mrv2_prof.cli.fetch import fetch
from mrv2_prof.cli.gate import gate
from mrv2_prof.cli.help_text import Command
from mrv2_prof.cli.run import run
from mrv2_prof.cli.stored import runs, show
from mrv2_prof.cli.views import export, nsys_app, report, tui
from mrv2_prof.entry_messages import debugging, internal_error, interrupted, say

# typer 0.26 to 0.29 (what pyproject.toml allows) carries its own copy of click as
# ``typer._click``; Abort moved from there to ``typer.exceptions`` in 0.28, and ``typer.Abort``
# names it in every one of them. The classes are looked up here, at import, so that a typer that
# moved them fails at once rather than inside an ``except`` clause of ``main_entry``.
NoArgsIsHelpError: type[Exception] = _click_exceptions.NoArgsIsHelpError
UsageError: type[Exception] = _click_exceptions.UsageError
ClickException: type[Exception] = _click_exceptions.ClickException
Abort: type[Exception] = typer.Abort
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer its reader left

app = typer.Typer(
    help="Profile an embedded vLLM Model Runner V2 style runner: run a scenario, watch it live, "
    "then query the run in DuckDB.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # click's help: flags as flags, docstrings re-wrapped to the terminal
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """mrv2-prof: what each MRV2 mechanism buys on your GPU and workload."""


for _command in (run, runs, show, compare, gate, report, export, tui, fetch):
    app.command(cls=Command)(_command)
app.add_typer(nsys_app, name="nsys")
app.add_typer(baseline_app, name="baseline")


class StdoutFailed(Exception):
    """A write to stdout failed (its reader is gone, the disk is full): raised in place of the
    ``OSError`` so that it cannot be taken for another file's error, nor handled by click as its
    own broken pipe."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _CheckedStdout:
    """``sys.stdout`` while a command runs: the same stream, its write errors raised as
    ``StdoutFailed``."""

    def __init__(self, stream: io.TextIOBase) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise StdoutFailed(exc) from exc

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise StdoutFailed(exc) from exc

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _degrade_encoding() -> None:
    """Text stdout or stderr cannot encode (a non-UTF-8 locale, ``PYTHONIOENCODING=ascii``, a
    lone surrogate from a file name) is printed as ``?`` on stdout and as an escape on stderr."""
    for stream, errors in ((sys.stdout, "replace"), (sys.stderr, "backslashreplace")):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            with contextlib.suppress(OSError, ValueError):  # closed: its writes fail on their own
                stream.reconfigure(errors=errors)


def _stdout_failed(stdout: io.TextIOBase, error: OSError) -> int:
    """Give up on stdout: what is still buffered, and anything printed later, goes to the null
    device (so that the interpreter's last flush cannot fail again: the Python docs' "Note on
    SIGPIPE"). A closed pipe (``mrv2-prof runs | head``) ends quietly with exit code 141, as a
    process killed by SIGPIPE would, and not 1, which means a failed run or gate; any other
    error (ENOSPC on ``> /dev/full``, EIO) is one line and exit code 1."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stdout.fileno())
        finally:
            os.close(null)
    except (OSError, ValueError, AttributeError):  # no file descriptor behind stdout
        pass
    if error.errno == errno.EPIPE:
        return EXIT_BROKEN_PIPE
    say(f"error: cannot write to stdout: {error.strerror or error}")
    return 1


def _invoke(argv: list[str] | None) -> int:
    """``app`` with click's exceptions as one line and an exit code; help is printed as click
    prints it (bare ``mrv2-prof`` shows it on stderr and exits 2, as before)."""
    try:
        code = app(prog_name="mrv2-prof", args=argv, standalone_mode=False)
    except NoArgsIsHelpError as exc:
        ctx = getattr(exc, "ctx", None)
        say(ctx.get_help() if ctx else str(exc))
        return 2
    except UsageError as exc:
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx else "mrv2-prof"
        message = " ".join(exc.format_message().split())
        say(f"error: {message} (see '{where} --help')")
        return 2
    except ClickException as exc:
        say(f"error: {' '.join(exc.format_message().split())}")
        return exc.exit_code
    except Abort:
        return interrupted()
    return code if isinstance(code, int) else 0


def main_entry(argv: list[str] | None = None) -> NoReturn:
    """Run the command line and exit; never a traceback.

    Usage errors (an unknown option, a missing value) are one line on stderr and exit code 2,
    like every other bad input; Ctrl-C is ``interrupted`` and 130; stdout closed early (``|
    head``) ends quietly with 141, stdout that cannot be written (``> /dev/full``) is one line
    and 1; an unexpected exception is one line naming it and 1 (``MRV2_PROF_DEBUG=1`` raises it
    instead, with its traceback). Output that the terminal's encoding cannot show is replaced,
    not fatal."""
    _degrade_encoding()
    stdout = sys.stdout
    if stdout is not None:
        sys.stdout = _CheckedStdout(stdout)
    try:
        code = _invoke(argv)
        sys.stdout.flush()
    except SystemExit as exc:  # a command's sys.exit, or click's own exit on a broken pipe
        code = exc.code
    except StdoutFailed as exc:
        code = _stdout_failed(stdout, exc.error)
    except KeyboardInterrupt:
        code = interrupted()
    except Exception as exc:
        if debugging():
            raise
        code = internal_error(exc)
    finally:
        sys.stdout = stdout
    if stdout is not None:
        try:
            stdout.flush()  # click's broken-pipe exit leaves what it could not write buffered
        except OSError as exc:
            code = _stdout_failed(stdout, exc)
    sys.exit(code)
