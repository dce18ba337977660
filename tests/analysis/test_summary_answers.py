"""The printed summary (end of ``run``, ``show``) ends with a few answers when the run has text:
the first requests' last user message and output, shortened, printed as text (no markup, no
terminal escapes). Over the hand-made text run of tests/text_runs.py."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from mrv2_prof.analysis.summary import render_summary
from mrv2_prof.cli import app
from mrv2_prof.store import Store
from tests.text_runs import ESCAPE, PLAIN_RUN, TEXT_RUN, add_text_run, answer, question


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        add_text_run(store, PLAIN_RUN, with_text=False)
        add_text_run(store)
        store.connection.execute(  # a terminal escape in the first answer
            "UPDATE requests SET output_text = output_text || ? WHERE req_id = 'r00'", [ESCAPE]
        )
    return path


def _printed(db: Path, run_id: str, width: int = 100) -> str:
    out = io.StringIO()
    with Store.open(db, read_only=True) as store:
        Console(file=out, width=width, color_system=None).print(render_summary(store, run_id))
    return out.getvalue()


def _answer_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("answers"))
    return [line.rstrip() for line in lines[start:]]


def test_the_summary_ends_with_the_first_three_answers(db: Path) -> None:
    assert _answer_lines(_printed(db, TEXT_RUN)) == [
        "answers (the first 3 of 10 requests with an output)",
        f"r00 asked  {question(0)}",  # the user message of the template, markup as text
        f"    answer {answer(0)}[2J",  # the ESC character removed: the rest is plain text
        f"r01 asked  {question(1)}",
        f"    answer {answer(1)}",
        f"r02 asked  {question(2)}",
        f"    answer {answer(2)}",
    ]


def test_a_long_answer_is_cut_to_about_two_lines(db: Path) -> None:
    with Store.open(db) as store:
        store.connection.execute(
            "UPDATE requests SET output_text = repeat('word ', 100) WHERE req_id = 'r01'"
        )
    lines = _answer_lines(_printed(db, TEXT_RUN, width=80))
    cut = lines[
        lines.index("r01 asked  " + question(1)) + 1 : lines.index("r02 asked  " + question(2))
    ]
    assert len(cut) == 2 and cut[-1].endswith("word…")  # 120 characters on 80 columns


def test_a_run_without_text_prints_no_answers(db: Path) -> None:
    assert "answers" not in _printed(db, PLAIN_RUN)


def test_show_prints_the_answers(db: Path) -> None:
    result = CliRunner().invoke(app, ["show", TEXT_RUN, "--db", str(db)], terminal_width=100)
    assert result.exit_code == 0, result.output
    assert f"r02 asked  {question(2)}" in result.output and "\x1b" not in result.output
