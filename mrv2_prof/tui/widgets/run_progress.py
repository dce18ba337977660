"""Run progress: the run's name, its requests done and elapsed time over a progress bar.

The bar counts output tokens (``digest.token_progress``): settled tokens of the total of every
request's max_tokens, so it moves while a burst of requests decodes together (counted in
requests it would sit at 0 % until the last step). A producer that does not send the workload's
max_tokens gets a bar of requests done, and the text beside the bar says which it is.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import ProgressBar, Static

from mrv2_prof.tui.digest import progress_line, token_progress
from mrv2_prof.views.format import format_count, format_duration
from mrv2_prof.views.safe_text import plain
from mrv2_prof.views.snapshot import Snapshot


class RunProgress(Vertical):
    """``label (run id on device) ... done / total requests · elapsed`` over ``bar ... measure``."""

    def compose(self) -> ComposeResult:
        with Horizontal(id="run-head"):
            yield Static("waiting for the first snapshot…", id="run-label", markup=False)
            yield Static("", id="run-counts", markup=False)
        with Horizontal(id="run-bar-row"):
            yield ProgressBar(total=None, show_eta=False, id="run-bar")
            yield Static("", id="run-measure", markup=False)

    def show(self, snapshot: Snapshot) -> None:
        device = f" on {snapshot.device}" if snapshot.device else ""
        self.query_one("#run-label", Static).update(
            plain(f"{snapshot.label}  ({snapshot.run_id}{device})")
        )
        tokens = token_progress(snapshot)
        done, total = tokens if tokens is not None else (snapshot.num_done, snapshot.num_requests)
        self.query_one("#run-bar", ProgressBar).update(total=total, progress=done)
        self.query_one("#run-measure", Static).update(progress_line(snapshot))
        self.query_one("#run-counts", Static).update(
            f"{format_count(snapshot.num_done)} / {format_count(snapshot.num_requests)} requests"
            f"  ·  elapsed {format_duration(snapshot.elapsed_s)}"
        )
