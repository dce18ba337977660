"""Text from outside the program, made safe to print: no control characters, no markup."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from mrv2_prof.views.safe_text import markup_safe, plain, shorten, shown

HOSTILE = ["[/x]", "[bold]b[/bold]", "a\\", "[/]", "x[link=http://e]y", "\\[/x]"]


def printed(markup: str) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(markup, soft_wrap=True)
    return console.file.getvalue().rstrip("\n")


@pytest.mark.parametrize("text", HOSTILE)
def test_markup_safe_prints_as_it_reads(text):
    assert printed(markup_safe(text)) == text
    assert printed(f"[bold]error:[/] {markup_safe(text)}") == f"error: {text}"


@pytest.mark.parametrize("text", HOSTILE)
def test_markup_safe_in_a_table_cell(text):
    table = Table()
    table.add_column("label")
    table.add_row(markup_safe(text))
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(table)
    assert text in console.file.getvalue()


def test_plain_strips_control_characters():
    assert plain("\x1b[31mred\x1b[0m") == "[31mred[0m"  # no ESC reaches the terminal
    assert plain("a\nb\tc\rd") == "a b c d"
    assert plain("x\x00\x07\x7f\x9by") == "xy"
    assert plain("abc\u202edef") == "abcdef"  # a bidi override reorders what follows
    assert plain(12) == "12"


def test_plain_and_shorten_cut_long_text():
    assert shorten("abcdef", 10) == "abcdef"
    cut = plain("y" * 1_000_000, limit=50)
    assert len(cut) < 60 and cut.startswith("y" * 30) and "(1,000,000 chars)" in cut


def test_shown_is_bounded_for_any_value():
    bomb: list = [1]
    for _ in range(40):
        bomb = [bomb] * 9  # 9**40 leaves if expanded
    assert len(shown(bomb)) <= 80
    assert shown("x" * 10**6).startswith("'xxx") and len(shown("x" * 10**6)) <= 80
    assert shown(True) == "True" and shown("8") == "'8'"
