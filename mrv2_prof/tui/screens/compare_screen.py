"""Two runs side by side: every gate metric of A and B with B's change, better or worse.

The metrics and verdicts are ``report.gate_metrics`` / ``report.compare`` (the same numbers
``mrv2-prof compare`` prints), computed by a worker thread. When the screen is too narrow for
every column, the ``B − A`` column is left out (the % change and the verdict stay), so no value
is cut.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
from rich.text import Text
from textual import events, work
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
        self.runs: tuple[RunMetrics, RunMetrics] | None = None
        self.with_delta = True  # the B − A column is shown (it fits)

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
        self._fill()
        self.load_metrics()

    def _rows(self) -> list[tuple[str, Text, Text, Text, Text, Text]]:
        rows = []
        for d in compare(*self.runs) if self.runs is not None else ():
            m = METRICS[d.name]
            style = VERDICT_STYLE[d.verdict]
            change = "-" if d.delta is None else m.format_delta(d.delta)
            rows.append((
                d.name + ("" if m.direction == LOWER else " ↑"),
                Text(m.format(d.a), justify="right"), Text(m.format(d.b), justify="right"),
                Text(change, style, justify="right"),
                Text(format_pct(d.delta_pct, d.delta), style, justify="right"),
                Text(d.verdict or "", style),
            ))  # fmt: skip
        return rows

    def _fits_delta(self, rows: list) -> bool:
        """Whether every column, B − A included, fits the screen's width (cells padded by one
        each side, a scrollbar)."""
        headers = ("metric", f"A {self.run_a}", f"B {self.run_b}", "B − A", "%", "")
        widths = [2 + max([len(h)] + [len(str(r[i])) for r in rows]) for i, h in enumerate(headers)]
        return sum(widths) + 2 <= self.size.width

    def _fill(self) -> None:
        """The table anew: the rows once the metrics are in, and B − A only if it fits."""
        rows = self._rows()
        self.with_delta = self._fits_delta(rows)
        table = self.query_one("#compare-table", DataTable)
        table.clear(columns=True)
        table.add_column("metric", key="metric")
        table.add_column(f"A {self.run_a}", key="a")
        table.add_column(f"B {self.run_b}", key="b")
        if self.with_delta:
            table.add_column("B − A", key="delta")
        table.add_column("%", key="pct")
        table.add_column("", key="verdict")
        for name, a, b, delta, pct, verdict in rows:
            cells = (name, a, b, *([delta] if self.with_delta else []), pct, verdict)
            table.add_row(*cells, key=name.removesuffix(" ↑"))

    def on_resize(self, event: events.Resize) -> None:
        if self._fits_delta(self._rows()) != self.with_delta:
            self._fill()

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
        self.runs = (a, b)
        self._fill()
        self.loaded = True

    def on_compare_screen_load_failed(self, message: LoadFailed) -> None:
        self.loaded = True
        self.query_one("#compare-title", Static).update(plain(f"cannot compare: {message.error}"))
        self.notify(markup_safe(message.error), title="cannot compare", severity="error")
