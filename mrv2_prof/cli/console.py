"""The command line's two consoles and its one way to fail on bad input."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import typer
from rich.console import Console

from mrv2_prof.views.safe_text import markup_safe

# Piped or logged output is not cut to 80 columns (tables of a matrix sweep are wide).
_WIDTH = None if sys.stdout.isatty() else 140
err = Console(stderr=True, width=_WIDTH)
out = Console(width=_WIDTH)
MESSAGE_LIMIT = 1000  # characters of an error message printed (a longer one is cut, marked)


def fail(message: str) -> None:
    """One line on stderr, exit code 2 (the message printed as it reads, never as markup)."""
    text = markup_safe(message, limit=MESSAGE_LIMIT)
    err.print(f"[bold red]error:[/] {text}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(2)


def checked_db(path: Path | None) -> Path | None:
    """``path`` of a run database, refused (one line, exit 2) when it exists and is not a
    regular file: a FIFO or a device would block or be clobbered, a directory is a mistake.
    A ``--db`` option's callback; ``run`` calls it for the scenario's ``store.db`` too."""
    if path is None:
        return None
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        fail(f"{path}: cannot open the run database ({exc.strerror or exc})")
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a FIFO or a device)"
        fail(f"{path}: is {kind}; the run database must be a regular file")
    return path


def db_option(help: str = "DuckDB file.") -> typer.models.OptionInfo:
    """``--db``: a run database, checked by ``checked_db`` (default ``runs.duckdb``)."""
    return typer.Option(Path("runs.duckdb"), "--db", callback=checked_db, readable=False, help=help)


def db_b_option(help: str) -> typer.models.OptionInfo:
    """``--db-b``: the second side's run database (default: ``--db``)."""
    return typer.Option(
        None, "--db-b", callback=checked_db, readable=False, help=help, show_default=False
    )
