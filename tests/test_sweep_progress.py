"""The sweep's progress bar (``pipeline/executors/sweep_progress.py``): on a terminal a bar of
the cells landed with done / running / failed, each cell's line above it; off a terminal the
lines alone, as a log reads them."""

from __future__ import annotations

import io
import re

from rich.console import Console

from mrv2_prof.pipeline.executors.sweep_progress import SweepProgress


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=120, color_system=None), out


def test_on_a_terminal_the_bar_counts_the_cells_landed_and_the_lines_print_above_it():
    console, out = _console(True)
    with SweepProgress(console, 4) as p:
        p.update(done=0, running=2, failed=0)
        p.say("cell 1/4 completed on host-a: [bold]seed=0[/]")
        p.update(done=1, running=2, failed=0)
        p.say("cell 2/4 failed on host-b: [bold]seed=1[/]")
        p.update(done=1, running=1, failed=1)
        p.update(done=3, running=0, failed=1)
        assert p.counts == {"done": 3, "running": 0, "failed": 1}
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # cursor moves of the live bar
    assert "cell 1/4 completed on host-a: seed=0" in text
    assert "cell 2/4 failed on host-b: seed=1" in text
    # the bar's last state: 4 of 4 landed (3 done + 1 failed), with the counts
    assert re.search(r"cells .*4/4 done 3, running 0, failed 1", text), text[-400:]


def test_off_a_terminal_only_the_lines_are_printed():
    console, out = _console(False)
    with SweepProgress(console, 2) as p:
        p.update(done=0, running=1, failed=0)
        p.say("cell 1/2 completed on h: x")
        p.update(done=1, running=0, failed=0)
    assert out.getvalue() == "cell 1/2 completed on h: x\n"
