"""How ``--help`` lays out a command: prose re-wrapped to the terminal, examples and tables as
written, and the usage line naming arguments plainly (``RUN_ID``, not ``{RUN_ID}``).

Every command is registered with ``cls=Command``. A docstring paragraph is kept as written when
one of its lines is indented or holds two spaces in a row (an example, a table, an aligned
list); any other paragraph is prose and is re-wrapped, so a docstring's own line breaks never
show as a ragged right edge.
"""

from __future__ import annotations

import inspect
import re

from typer.core import TyperCommand

_VERBATIM = "\b"  # click keeps a paragraph that starts with this line as it is
_BRACED = re.compile(r"\{([^{}]*)\}")


def layout(help_text: str) -> str:
    """``help_text`` (a docstring) with each preformatted paragraph marked verbatim."""
    paragraphs = inspect.cleandoc(help_text).split("\n\n")
    return "\n\n".join(_VERBATIM + "\n" + p if _preformatted(p) else p for p in paragraphs)


def _preformatted(paragraph: str) -> bool:
    return any(line.startswith(" ") or "  " in line.strip() for line in paragraph.splitlines())


class Command(TyperCommand):
    """A typer command with the help layout above."""

    def __init__(self, *args, help: str | None = None, **kwargs) -> None:  # noqa: A002 - click's name
        super().__init__(*args, help=layout(help) if help else help, **kwargs)

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [_BRACED.sub(r"\1", piece) for piece in super().collect_usage_pieces(ctx)]
