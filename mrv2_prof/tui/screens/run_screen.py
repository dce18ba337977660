"""One run: its summary (the tables ``mrv2-prof show`` prints) and its step timeline.

The step timeline is a scrollable table, one row per engine step: graph mode, tokens, host time,
overlap, the GPU bubble before it and its kind, and how many sync points it had; a long run is
shown ``STEP_PAGE`` steps at a time (``]`` / ``[`` for the next / previous page). Everything is
read by worker threads.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static, TabbedContent, TabPane

from mrv2_prof.store import Store, StoreError
from mrv2_prof.store.metrics import RunSummary, run_summary
from mrv2_prof.summary import summary_tables
from mrv2_prof.tui import run_queries
from mrv2_prof.tui.run_queries import StepRow, load_steps
from mrv2_prof.views.format import NO_VALUE, format_count, format_ms, format_percent, one_line
from mrv2_prof.views.safe_text import markup_safe, plain

STEP_COLUMNS = (
    ("step", "step"),
    ("mode", "mode"),
    ("tokens", "tokens"),
    ("host", "host"),
    ("overlap", "overlap"),
    ("bubble", "bubble"),
    ("kind", "bubble kind"),
    ("syncs", "syncs"),
)


def step_cells(r: StepRow) -> tuple[str, ...]:
    return (
        str(r.step),
        markup_safe(r.graph_mode or NO_VALUE),
        NO_VALUE if r.num_tokens is None else format_count(r.num_tokens),
        format_ms(r.host_ms),
        format_percent(r.overlap_frac),
        format_ms(r.bubble_ms),
        markup_safe(r.bubble_kind or NO_VALUE),
        format_count(r.num_syncs),
    )


class RunScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("s", "show_tab('summary')", "Summary"),
        Binding("t", "show_tab('steps')", "Steps"),
        Binding("right_square_bracket", "page(1)", "Next steps", show=False),
        Binding("left_square_bracket", "page(-1)", "Previous steps", show=False),
    ]

    class RunLoaded(Message):
        def __init__(self, summary: RunSummary) -> None:
            super().__init__()
            self.summary = summary

    class StepsLoaded(Message):
        def __init__(self, start: int, steps: list[StepRow], total: int) -> None:
            super().__init__()
            self.start = start
            self.steps = steps
            self.total = total

    class LoadFailed(Message):
        def __init__(self, error: str) -> None:
            super().__init__()
            self.error = error

    def __init__(self, db_path: Path, run_id: str) -> None:
        super().__init__()
        self.db_path = db_path
        self.run_id = run_id
        self.loaded = False  # the summary and a page of steps are in (or failed)
        self.page_start = 0  # position of the first step shown
        self.num_steps = 0
        self.summary: RunSummary | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(plain(f"run {self.run_id}: loading…"), id="run-title", markup=False)
        with TabbedContent(initial="summary"):
            with TabPane("summary", id="summary"), VerticalScroll(id="summary-scroll"):
                yield Static("", id="summary-body")
            with TabPane("steps", id="steps"):
                yield DataTable(id="steps-table", cursor_type="row", zebra_stripes=True)
                yield Static("", id="steps-note", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#steps-table", DataTable)
        for key, label in STEP_COLUMNS:
            table.add_column(label, key=key)
        self.query_one("#summary-scroll").focus()  # arrow keys scroll the summary
        self.load_run()

    @work(thread=True, exclusive=True, group="run")
    def load_run(self) -> None:
        try:
            with Store.open(self.db_path, read_only=True) as store:
                self.post_message(self.RunLoaded(run_summary(store, self.run_id)))
                steps, total = load_steps(store, self.run_id, 0, run_queries.STEP_PAGE)
        except (StoreError, duckdb.Error) as exc:
            self.post_message(self.LoadFailed(one_line(exc)))
            return
        self.post_message(self.StepsLoaded(0, steps, total))

    @work(thread=True, exclusive=True, group="steps")
    def load_page(self, start: int) -> None:
        try:
            with Store.open(self.db_path, read_only=True) as store:
                steps, total = load_steps(store, self.run_id, start, run_queries.STEP_PAGE)
        except (StoreError, duckdb.Error) as exc:
            self.post_message(self.LoadFailed(one_line(exc)))
            return
        self.post_message(self.StepsLoaded(start, steps, total))

    def on_run_screen_run_loaded(self, message: RunLoaded) -> None:
        s = self.summary = message.summary
        self.query_one("#run-title", Static).update(
            plain(f"run {s.run_id}  {s.label or ''}  [{s.status}]  {s.steps:,} steps")
        )
        self.query_one("#summary-body", Static).update(summary_tables(s))

    def on_run_screen_steps_loaded(self, message: StepsLoaded) -> None:
        self.page_start, self.num_steps = message.start, message.total
        table = self.query_one("#steps-table", DataTable)
        table.clear()
        table.add_rows(step_cells(r) for r in message.steps)
        end = message.start + len(message.steps)
        note = ""
        if message.start > 0 or end < message.total:
            note = (
                f"steps {message.start:,}–{end - 1:,} of {message.total:,} (by position)"
                "  ·  ] next  [ previous"
            )
        self.query_one("#steps-note", Static).update(note)
        self.loaded = True

    def action_page(self, direction: int) -> None:
        start = self.page_start + direction * run_queries.STEP_PAGE
        if self.loaded and 0 <= start < self.num_steps:
            self.load_page(start)

    def on_run_screen_load_failed(self, message: LoadFailed) -> None:
        self.loaded = True
        self.query_one("#run-title", Static).update(plain(f"run {self.run_id}: {message.error}"))
        self.notify(markup_safe(message.error), title="cannot read the run", severity="error")

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        """Whichever way a tab was chosen, its content takes the keys (scrolling, cursor)."""
        target = "#steps-table" if event.pane.id == "steps" else "#summary-scroll"
        self.query_one(target).focus()
