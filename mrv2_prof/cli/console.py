"""The command line's two consoles and its one way to fail on bad input."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

# Piped or logged output is not cut to 80 columns (tables of a matrix sweep are wide).
_WIDTH = None if sys.stdout.isatty() else 140
err = Console(stderr=True, width=_WIDTH)
out = Console(width=_WIDTH)


def fail(message: str) -> None:
    """One line on stderr, exit code 2."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(2)
