"""The run browser's first screen: every run in the database, newest first.

Enter opens a run; ``c`` marks a run as A and ``c`` on another opens the A/B comparison. The
list comes from a worker thread at once; each run's headline numbers (output tokens/s, ITL p99)
follow one by one from the same worker, so a large database never blocks the screen.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static
from textual.worker import get_current_worker

from mrv2_prof.store import Store, StoreError
from mrv2_prof.tui.run_queries import Headline, RunRow, headline, list_run_rows
from mrv2_prof.tui.screens.compare_screen import CompareScreen
from mrv2_prof.tui.screens.run_screen import RunScreen
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
HINT = "enter: open · c: mark for comparison · r: reload · ?: help · q: quit"


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
        def __init__(self, run_id: str, numbers: Headline) -> None:
            super().__init__()
            self.run_id = run_id
            self.numbers = numbers

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
        self.loaded = False  # the list and every headline are in

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(plain(f"runs in {self.db_path}"), id="runs-title", markup=False)
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Static(HINT, id="runs-status", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#runs", DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        table.focus()
        self.load_runs()

    @work(thread=True, exclusive=True, group="runs")
    def load_runs(self) -> None:
        worker = get_current_worker()
        try:
            with Store.open(self.db_path, read_only=True) as store:
                rows = list_run_rows(store)
                self.post_message(self.RunsLoaded(rows))
                for row in rows:
                    if worker.is_cancelled:
                        return
                    self.post_message(self.HeadlineLoaded(row.run_id, headline(store, row.run_id)))
        except (StoreError, duckdb.Error) as exc:
            self.post_message(self.LoadFailed(one_line(exc)))
            return
        self.post_message(self.AllLoaded())

    def on_runs_screen_runs_loaded(self, message: RunsLoaded) -> None:
        self.rows = message.rows
        self.marked = None
        table = self.query_one("#runs", DataTable)
        table.clear()
        for r in message.rows:
            table.add_row(
                "", markup_safe(r.run_id), markup_safe(r.label), markup_safe(r.status), r.started,
                markup_safe(r.device),
                format_count(r.num_requests), PENDING, PENDING, key=r.run_id,
            )  # fmt: skip
        if not message.rows:
            self._say(f"no runs in {self.db_path} yet; start one with: mrv2-prof run --db PATH")

    def on_runs_screen_headline_loaded(self, message: HeadlineLoaded) -> None:
        table = self.query_one("#runs", DataTable)
        if message.run_id not in table.rows:  # from a load that a reload replaced
            return
        tok_s, itl = message.numbers.output_tokens_per_s, message.numbers.itl_ms_p99
        tok_s_text = NO_VALUE if tok_s is None else format_rate(tok_s)
        table.update_cell(message.run_id, "tok_s", tok_s_text, update_width=True)
        table.update_cell(message.run_id, "itl_p99", format_ms(itl), update_width=True)

    def on_runs_screen_all_loaded(self, message: AllLoaded) -> None:
        self.loaded = True

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
            self._say(HINT)

    def _say(self, line: str) -> None:
        self.query_one("#runs-status", Static).update(plain(line))
