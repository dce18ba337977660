"""The run browser's first screen: every run in the database, newest first.

Enter opens a run; ``c`` marks a run as A and ``c`` on another opens the A/B comparison. The
list comes from a worker thread at once; each run's headline numbers (output tokens/s, ITL p99)
follow one by one from the same worker, so a large database never blocks the screen. Each run's
numbers are read on their own (``tui/run_figures.py``): a live run's show ``live`` (its runner
holds its side file) or its figures so far (``*``), and a run that cannot be read shows the
reason in its label cell; neither stops the other runs' numbers. The label column takes the width
the other columns leave (a long label or a reason ends in "…" and the line under the table shows
it whole for the run under the cursor), so the numbers are never cut.
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
from textual.worker import get_current_worker

from mrv2_prof.analysis.run_queries import RunRow, list_run_rows
from mrv2_prof.store import Store, StoreError
from mrv2_prof.tui.run_figures import FROM_DATABASE, LIVE, SO_FAR, UNREAD, RunFigures, run_figures
from mrv2_prof.tui.screens.compare_screen import CompareScreen
from mrv2_prof.tui.screens.run_screen import RunScreen
from mrv2_prof.tui.widgets.measured_table import MeasuredTable
from mrv2_prof.views.format import NO_VALUE, format_count, format_ms, format_rate, one_line
from mrv2_prof.views.safe_text import markup_safe, plain

COLUMNS = (
    ("mark", ""),
    ("run", "run"),
    ("label", "label"),
    ("status", "status"),
    ("started", "started"),
    ("device", "device"),
    ("requests", "reqs"),
    ("tok_s", "tok/s"),
    ("itl_p99", "ITL p99"),
)
MARK = "A"
PENDING = "…"
UNREAD_CELL = "error"  # the figures of a run that could not be read (the reason: its label cell)
SO_FAR_MARK = "*"
HINT = "enter: open · c: mark for comparison · r: reload · ?: help · q: quit"
LEGEND = {
    LIVE: "live: a run still writing, figures once it ends",
    SO_FAR: f"{SO_FAR_MARK}: so far, from a live run's side file",
    UNREAD: f"{UNREAD_CELL}: figures not read, the reason in the label",
}
MIN_LABEL = 8  # the label column never gets narrower than this
SCROLLBAR = 2


class RunsScreen(Screen[None]):
    BINDINGS = [
        Binding("c", "mark", "Compare"),
        Binding("r", "reload", "Reload"),
        Binding("escape", "clear_mark", "Clear mark", show=False),
    ]

    class RunsLoaded(Message):
        def __init__(self, rows: list[RunRow]) -> None:
            super().__init__()
            self.rows = rows

    class HeadlineLoaded(Message):
        def __init__(self, run_id: str, figures: RunFigures) -> None:
            super().__init__()
            self.run_id = run_id
            self.figures = figures

    class AllLoaded(Message):
        """The worker has posted the list and every headline."""

    class LoadFailed(Message):
        def __init__(self, error: str) -> None:
            super().__init__()
            self.error = error

    def __init__(self, db_path: Path) -> None:
        super().__init__()
        self.db_path = db_path
        self.marked: str | None = None
        self.rows: list[RunRow] = []
        self.numbers: dict[str, tuple[str, str]] = {}  # run id -> tok/s, ITL p99 as shown
        self.figures: dict[str, RunFigures] = {}  # run id -> where its numbers came from
        self.loaded = False  # the list and every headline are in
        self.label_width = 0

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(plain(f"runs in {self.db_path}"), id="runs-title", markup=False)
        yield MeasuredTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Static(HINT, id="runs-status", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#runs", DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        table.focus()
        self.load_runs()

    def _cells(self, r: RunRow) -> list[str]:
        """The row's cells as shown (the label plain: it goes in as a ``Text``)."""
        tok_s, itl = self.numbers.get(r.run_id, (PENDING, PENDING))
        figures = self.figures.get(r.run_id)
        label = figures.why if figures is not None and figures.kind == UNREAD else r.label
        return [
            MARK if r.run_id == self.marked else "", markup_safe(r.run_id), plain(label),
            markup_safe(r.status), r.started, markup_safe(r.device), format_count(r.num_requests),
            tok_s, itl,
        ]  # fmt: skip

    def _label_width(self) -> int:
        """What the other columns leave of the screen's width, within MIN_LABEL and the
        longest label."""
        rows = [self._cells(r) for r in self.rows]
        label_col = [key for key, _ in COLUMNS].index("label")
        others = sum(
            2 + max([len(header)] + [len(row[i]) for row in rows])
            for i, (_, header) in enumerate(COLUMNS)
            if i != label_col
        )
        longest = max([len("label")] + [len(row[label_col]) for row in rows])
        room = self.size.width - others - SCROLLBAR - 2
        return max(MIN_LABEL, min(longest, room))

    def _fill(self) -> None:
        """The table anew from ``rows`` and ``numbers``, the label column fitted to the width."""
        table = self.query_one("#runs", DataTable)
        cursor = table.cursor_row
        self.label_width = self._label_width()
        table.clear(columns=True)
        for key, label in COLUMNS:
            table.add_column(label, key=key, width=self.label_width if key == "label" else None)
        for r in self.rows:
            cells: list = self._cells(r)
            cells[2] = Text(cells[2], overflow="ellipsis", no_wrap=True)
            table.add_row(*cells, key=r.run_id)
        if self.rows:
            table.move_cursor(row=min(cursor, len(self.rows) - 1))

    def on_resize(self, event: events.Resize) -> None:
        if self.rows:
            self._fill()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self.marked is None and self.loaded:
            self._say(self._row_note(event.row_key.value) or self._hint())

    def _row_note(self, run_id: str | None) -> str | None:
        """Under the table, for the run under the cursor: where its figures come from when not
        the database (or why there are none), else its label when its cell cuts it."""
        row = next((r for r in self.rows if r.run_id == run_id), None)
        if row is None:
            return None
        figures = self.figures.get(row.run_id)
        if figures is not None and figures.kind != FROM_DATABASE:
            return f"{row.run_id} ({row.label}): {figures.why}"
        if len(plain(row.label)) > self.label_width:
            return f"{row.run_id}: {row.label}"
        return None

    def _hint(self) -> str:
        """The keys, and what the marks in the figure columns mean when the list has them."""
        kinds = {f.kind for f in self.figures.values()}
        return " · ".join([HINT, *(text for kind, text in LEGEND.items() if kind in kinds)])

    @work(thread=True, exclusive=True, group="runs")
    def load_runs(self) -> None:
        worker = get_current_worker()
        try:
            with Store.open(self.db_path, read_only=True) as store:
                rows = list_run_rows(store)
                self.post_message(self.RunsLoaded(rows))
                for row in rows:  # one run's problem is its own row's: the others still load
                    if worker.is_cancelled:
                        return
                    self.post_message(self.HeadlineLoaded(row.run_id, run_figures(store, row)))
        except (StoreError, duckdb.Error) as exc:
            self.post_message(self.LoadFailed(one_line(exc)))
            return
        self.post_message(self.AllLoaded())

    def on_runs_screen_runs_loaded(self, message: RunsLoaded) -> None:
        self.rows = message.rows
        self.marked = None
        self.numbers = {}
        self.figures = {}
        self._fill()
        if not message.rows:
            self._say(f"no runs in {self.db_path} yet; start one with: mrv2-prof run --db PATH")

    def on_runs_screen_headline_loaded(self, message: HeadlineLoaded) -> None:
        table = self.query_one("#runs", DataTable)
        if message.run_id not in table.rows:  # from a load that a reload replaced
            return
        figures = self.figures[message.run_id] = message.figures
        self.numbers[message.run_id] = shown = figure_cells(figures)
        table.update_cell(message.run_id, "tok_s", shown[0], update_width=True)
        table.update_cell(message.run_id, "itl_p99", shown[1], update_width=True)
        if figures.kind == UNREAD:  # the reason goes where the label was
            row = next(r for r in self.rows if r.run_id == message.run_id)
            label = Text(self._cells(row)[2], overflow="ellipsis", no_wrap=True)
            table.update_cell(message.run_id, "label", label)

    def on_runs_screen_all_loaded(self, message: AllLoaded) -> None:
        self.loaded = True
        if self._label_width() != self.label_width:  # the numbers took more room than pending
            self._fill()
        if self.marked is None:
            self._say(self._row_note(self._cursor_run()) or self._hint())
        unread = [run_id for run_id, f in self.figures.items() if f.kind == UNREAD]
        if unread:
            self.notify(
                markup_safe(f"{len(unread)} of {len(self.rows)} runs could not be read "
                            f"({', '.join(unread[:3])}{', …' if len(unread) > 3 else ''}); "
                            "their rows say why"),
                title="runs not read",
                severity="warning",
            )  # fmt: skip

    def on_runs_screen_load_failed(self, message: LoadFailed) -> None:
        self.loaded = True
        self._say(f"error: {message.error}")
        self.notify(markup_safe(message.error), title="cannot read the runs", severity="error")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.app.push_screen(RunScreen(self.db_path, event.row_key.value))

    def _cursor_run(self) -> str | None:
        table = self.query_one("#runs", DataTable)
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def action_mark(self) -> None:
        run_id = self._cursor_run()
        if run_id is None:
            return
        if self.marked is None or self.marked == run_id:
            self._set_mark(None if self.marked == run_id else run_id)
            return
        a, self.marked = self.marked, None
        self._set_mark(None, a)
        self.app.push_screen(CompareScreen(self.db_path, a, run_id))

    def action_clear_mark(self) -> None:
        self._set_mark(None)

    def action_reload(self) -> None:
        self.loaded = False
        self.load_runs()

    def _set_mark(self, run_id: str | None, previous: str | None = None) -> None:
        table = self.query_one("#runs", DataTable)
        previous = previous or self.marked
        if previous is not None and previous in table.rows:
            table.update_cell(previous, "mark", "")
        self.marked = run_id
        if run_id is not None:
            table.update_cell(run_id, "mark", MARK)
            self._say(f"A = {run_id}; press c on another run to compare (escape: clear)")
        else:
            self._say(self._hint())

    def _say(self, line: str) -> None:
        self.query_one("#runs-status", Static).update(plain(line))


def figure_cells(figures: RunFigures) -> tuple[str, str]:
    """The tok/s and ITL p99 cells of a run's figures: the numbers (``*`` when read so far from
    a live run's side file), ``live`` while its runner holds it, ``error`` when not read."""
    if figures.numbers is None:
        return (LIVE, LIVE) if figures.kind == LIVE else (UNREAD_CELL, UNREAD_CELL)
    tok_s, itl = figures.numbers.output_tokens_per_s, figures.numbers.itl_ms_p99
    cells = (NO_VALUE if tok_s is None else format_rate(tok_s), format_ms(itl))
    if figures.kind == SO_FAR:
        return tuple(c + SO_FAR_MARK for c in cells)  # type: ignore[return-value]
    return cells
