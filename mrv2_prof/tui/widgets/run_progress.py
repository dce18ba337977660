"""Run progress: requests done (finished + aborted) of the workload's total, and elapsed time."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import ProgressBar, Static

from mrv2_prof.snapshot import Snapshot
from mrv2_prof.views.format import format_count, format_duration
from mrv2_prof.views.safe_text import plain


class RunProgress(Vertical):
    """Two lines: ``label (run id) ... done / total · elapsed`` over a progress bar."""

    def compose(self) -> ComposeResult:
        with Horizontal(id="run-head"):
            yield Static("waiting for the first snapshot…", id="run-label", markup=False)
            yield Static("", id="run-counts", markup=False)
        yield ProgressBar(total=None, show_eta=False, id="run-bar")

    def show(self, snapshot: Snapshot) -> None:
        device = f" on {snapshot.device}" if snapshot.device else ""
        self.query_one("#run-label", Static).update(
            plain(f"{snapshot.label}  ({snapshot.run_id}{device})")
        )
        self.query_one("#run-bar", ProgressBar).update(
            total=snapshot.num_requests, progress=snapshot.num_done
        )
        self.query_one("#run-counts", Static).update(
            f"{format_count(snapshot.num_done)} / {format_count(snapshot.num_requests)} requests"
            f"  ·  elapsed {format_duration(snapshot.elapsed_s)}"
        )
