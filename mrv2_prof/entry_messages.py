"""What the entry points print for an unexpected error or Ctrl-C, shared by ``__main__`` (which
must stay light: it runs before the command line is imported) and ``cli.main_entry``. Imports
nothing of the project."""

from __future__ import annotations

import contextlib
import os
import sys

DEBUG_VARIABLE = "MRV2_PROF_DEBUG"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended
# time.time() as ``__main__.main`` began: the ``mrv2-prof`` command's own start (None where the
# command line is called in-process, as tests call it); ``run`` times its first runner's spawn
# from it (the start-up line's ``command`` phase)
command_started_at: float | None = None


def debugging() -> bool:
    """Whether ``MRV2_PROF_DEBUG`` asks for tracebacks (set, and neither empty nor ``0``)."""
    return os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


def say(line: str) -> None:
    """``line`` on stderr; nothing when stderr itself cannot be written (a closed pipe)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # closed, or none at all
        print(line, file=sys.stderr, flush=True)


def internal_error(exc: BaseException) -> int:
    """One line naming an unexpected exception (its message on one line, cut at 300
    characters); returns exit code 1."""
    try:
        message = " ".join(str(exc).split())
    except Exception:  # an exception whose message cannot be made
        message = ""
    if len(message) > 300:
        message = f"{message[:280]}... ({len(message):,} chars)"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    text = "".join(c if c.isprintable() else "?" for c in text)
    say(f"error: internal error: {text} (re-run with {DEBUG_VARIABLE}=1 for the traceback)")
    return 1


def interrupted() -> int:
    """``interrupted`` on stderr; returns exit code 130."""
    say("interrupted")
    return EXIT_INTERRUPTED
