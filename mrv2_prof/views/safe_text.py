"""Text from outside the program (scenario names, labels, trace ids, error messages, paths) made
safe to print: control characters removed and, for rich output, markup brackets escaped.

Every string a view shows that it did not write itself goes through one of these: ``plain`` for
text that is printed as it is (``markup=False``, a ``rich.text.Text``, a Textual ``Static``
without markup), ``markup_safe`` for text placed inside a rich markup string or a table cell
that rich (or Textual's ``DataTable``) reads as markup (escaped by rich's own rule).
"""

from __future__ import annotations

import re
import reprlib

from rich.markup import escape

# C0 and C1 control characters, DEL, and the bidirectional overrides and isolates (text that
# reorders what follows it on the terminal). Whitespace controls become a space.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SPACES = re.compile(r"[\t\n\r]")


def shorten(text: str, limit: int, length: int | None = None) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with the full ``length``."""
    length = len(text) if length is None else length
    if length <= limit:
        return text
    return f"{text[: max(limit - 20, 1)]}… ({length:,} chars)"


def plain(value: object, limit: int | None = None) -> str:
    """``str(value)`` without control characters (tabs and newlines become spaces), cut to
    ``limit`` characters when given."""
    text = value if isinstance(value, str) else str(value)
    length = len(text)
    if limit is not None and length > 4 * limit:
        text = text[: 4 * limit]  # bound the work on a huge value before cleaning it
    text = _CONTROL.sub("", _SPACES.sub(" ", text))
    if limit is None:
        return text
    return shorten(text, limit, length if length > 4 * limit else None)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple = 3, 4, 6, 6
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 60, 60, 40


def shown(value: object, limit: int = 80) -> str:
    """A value quoted in an error message: its repr, bounded however big or nested the value is
    (``reprlib`` stops at a few items and levels), without control characters."""
    try:
        text = _REPR.repr(value)
    except Exception:  # a value whose repr fails is named by its type
        text = f"<{type(value).__name__}>"
    return plain(text, limit)


def markup_safe(value: object, limit: int | None = None) -> str:
    """``plain(value)`` escaped for rich markup: printed as it reads, never as a style.

    rich's ``escape`` also doubles a trailing backslash (for a tag that may follow); here the
    text ends a cell or a line, where a doubled backslash would print as two.
    """
    text = plain(value, limit)
    trailing = len(text) - len(text.rstrip("\\"))
    return escape(text[: len(text) - trailing]) + text[len(text) - trailing :]
