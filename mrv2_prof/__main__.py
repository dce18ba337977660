"""``python -m mrv2_prof`` and the ``mrv2-prof`` console script (``main``).

This module imports nothing heavy, so that it is in charge from the start: the command line
(typer, DuckDB, torch...) takes a second or more to import, and Ctrl-C in that time ends with
``interrupted`` on stderr and exit code 130, an import that fails with one line and exit code 1,
never a traceback (``MRV2_PROF_DEBUG=1`` shows it). The rest (usage errors, a closed or full
stdout, an unexpected error in a command) is ``mrv2_prof.cli.main_entry``'s. Before that import,
Python's bytecode cache is turned on where the host left it off and ``rich``'s or the project's
bytecode is missing (``pipeline/bytecode_cache.cache_bytecode``, as the runner process does for
torch's), so the command line is not compiled from source at every command.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from mrv2_prof import entry_messages
from mrv2_prof.entry_messages import EXIT_INTERRUPTED, debugging, internal_error, interrupted
from mrv2_prof.pipeline.bytecode_cache import cache_bytecode


def _interrupted_while_importing(signum: int, frame: object) -> None:
    """SIGINT while the command line is imported: nothing is open or half written yet, so the
    process ends here (a KeyboardInterrupt could surface inside a library's import machinery)."""
    try:
        os.write(2, b"interrupted\n")
        standby = sys.modules.get("mrv2_prof.pipeline.standby")
        if standby is not None:  # a runner started for this command (os._exit runs no atexit)
            standby.dismiss()
    finally:
        os._exit(EXIT_INTERRUPTED)


def main() -> None:
    """Import the command line with Ctrl-C held, then run ``main_entry`` (which exits)."""
    entry_messages.command_started_at = time.time()
    held = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not when ignored
    if held:
        signal.signal(signal.SIGINT, _interrupted_while_importing)
    try:
        try:
            from mrv2_prof.pipeline import standby

            if standby.wanted(sys.argv):  # the runner's imports beside these (standby.py)
                standby.prespawn()
            cache_bytecode(("rich", "mrv2_prof.cli"))  # before the command line's imports
            from mrv2_prof.cli import main_entry
        except Exception as exc:
            if debugging():
                raise
            sys.exit(internal_error(exc))
        finally:
            if held:
                signal.signal(signal.SIGINT, signal.default_int_handler)
        main_entry()
    except KeyboardInterrupt:  # in the instant between restoring SIGINT and main_entry's own
        sys.exit(interrupted())


if __name__ == "__main__":
    main()
