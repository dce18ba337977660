"""The command line's two consoles and its one way to fail on bad input."""

from __future__ import annotations

import sys

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
