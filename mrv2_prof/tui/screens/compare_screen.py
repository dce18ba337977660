"""Two runs side by side: every gate metric of A and B with B's change, better or worse.

The metrics and verdicts are ``report.gate_metrics`` / ``report.compare`` (the same numbers
``mrv2-prof compare`` prints), computed by a worker thread.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from mrv2_prof.report.compare import compare, format_pct
from mrv2_prof.report.gate_metrics import LOWER, METRICS, RunMetrics, gate_metrics
from mrv2_prof.store import Store, StoreError
from mrv2_prof.views.format import one_line
from mrv2_prof.views.safe_text import markup_safe, plain

VERDICT_STYLE = {"better": "green", "worse": "red", "same": "", None: "dim"}
CAPTION = "lower is better except where marked ↑ · '-' = not measured"


def run_line(tag: str, run: RunMetrics) -> str:
    status = run.status + (f": {run.error}" if run.error else "")
    return f"{tag} = {run.run_id}  {run.label or ''}  [{status}]"


class CompareScreen(Screen[None]):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    class CompareLoaded(Message):
        def __init__(self, a: RunMetrics, b: RunMetrics) -> None:
            super().__init__()
            self.a = a
            self.b = b

    class LoadFailed(Message):
        def __init__(self, error: str) -> None:
            super().__init__()
            self.error = error

    def __init__(self, db_path: Path, run_a: str, run_b: str) -> None:
        super().__init__()
        self.db_path = db_path
        self.run_a = run_a
        self.run_b = run_b
        self.loaded = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(
            f"A = {plain(self.run_a)}\nB = {plain(self.run_b)}  (loading…)",
            id="compare-title",
            markup=False,
        )
        yield DataTable(id="compare-table", cursor_type="row", zebra_stripes=True)
        yield Static(CAPTION, id="compare-caption", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#compare-table", DataTable)
        table.add_column("metric", key="metric")
        table.add_column(f"A {self.run_a}", key="a")
        table.add_column(f"B {self.run_b}", key="b")
        table.add_column("B − A", key="delta")
        table.add_column("%", key="pct")
        table.add_column("", key="verdict")
        self.load_metrics()

    @work(thread=True, exclusive=True, group="compare")
    def load_metrics(self) -> None:
        try:
            with Store.open(self.db_path, read_only=True) as store:
                a = gate_metrics(store, self.run_a)
                b = gate_metrics(store, self.run_b)
        except (StoreError, duckdb.Error) as exc:
            self.post_message(self.LoadFailed(one_line(exc)))
            return
        self.post_message(self.CompareLoaded(a, b))

    def on_compare_screen_compare_loaded(self, message: CompareLoaded) -> None:
        a, b = message.a, message.b
        title = f"{plain(run_line('A', a))}\n{plain(run_line('B', b))}"
        self.query_one("#compare-title", Static).update(title)
        table = self.query_one("#compare-table", DataTable)
        for d in compare(a, b):
            m = METRICS[d.name]
            style = VERDICT_STYLE[d.verdict]
            table.add_row(
                d.name + ("" if m.direction == LOWER else " ↑"),
                Text(m.format(d.a), justify="right"),
                Text(m.format(d.b), justify="right"),
                Text("-" if d.delta is None else m.format_delta(d.delta), style, justify="right"),
                Text(format_pct(d.delta_pct, d.delta), style, justify="right"),
                Text(d.verdict or "", style),
                key=d.name,
            )
        self.loaded = True

    def on_compare_screen_load_failed(self, message: LoadFailed) -> None:
        self.loaded = True
        self.query_one("#compare-title", Static).update(plain(f"cannot compare: {message.error}"))
        self.notify(markup_safe(message.error), title="cannot compare", severity="error")
