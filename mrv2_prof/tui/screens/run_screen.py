"""One run: its summary (the findings and tables ``mrv2-prof show`` prints), its step table and
its requests (``widgets/request_view.py``: each request's prompt, output and token times).

The step table is a scrollable table, one row per engine step: graph mode, tokens, host time,
overlap, the GPU bubble before it and its kind, and how many sync points it had. ``o`` shows
the slowest steps first (again: step order), a click on a column header sorts by it, ``/``
filters (``host>2``, ``mode=none``, or a word of the mode or bubble kind), ``g`` jumps to a
step. A long run is shown ``STEP_PAGE`` steps at a time (``]`` / ``[`` for the next / previous
page). Everything is read by worker threads.
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
from textual.widgets import DataTable, Footer, Header, Input, Static, TabbedContent, TabPane

from mrv2_prof.analysis import run_queries
from mrv2_prof.analysis.finding_facts import FindingFacts, finding_facts
from mrv2_prof.analysis.findings import Finding, findings
from mrv2_prof.analysis.metrics import RunSummary, run_summary
from mrv2_prof.analysis.run_queries import (
    SLOWEST_FIRST,
    StepFilter,
    StepOrder,
    StepRow,
    load_steps,
    parse_step_filter,
    step_position,
)
from mrv2_prof.analysis.summary import summary_tables
from mrv2_prof.store import Store, StoreError
from mrv2_prof.tui.widgets.measured_table import MeasuredTable
from mrv2_prof.tui.widgets.request_view import RequestView
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
NUMERIC = ("tokens", "host", "overlap", "bubble", "syncs")  # sorted biggest first on a click
PROMPTS = {"filter": "filter: host>2, mode=none, syncs>0, host_bound…", "jump": "go to step:"}


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


def steps_note(order: StepOrder, where: StepFilter | None, start: int, shown: int, total: int):
    """The line under the step table: its order and filter when not the plain one, and the page
    when the steps do not fit on one ("" for every step in step order)."""
    parts = []
    if order != StepOrder():
        parts.append(f"sorted by {order.field} {'↓' if order.descending else '↑'} (o: step order)")
    if where is not None:
        parts.append(f"filter {where.text}: {total:,} steps")
    if start > 0 or start + shown < total:
        page = f"steps {start:,}–{start + shown - 1:,} of {total:,} (by position)"
        parts.append(f"{page}  ·  ] next  [ previous")
    return "  ·  ".join(parts)


class RunScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("s", "show_tab('summary')", "Summary"),
        Binding("t", "show_tab('steps')", "Steps"),
        Binding("r", "show_tab('requests')", "Requests"),
        Binding("o", "slowest_first", "Slowest", show=False),
        Binding("slash", "ask('filter')", "Filter", show=False),
        Binding("g", "ask('jump')", "Go to step", show=False),
        Binding("right_square_bracket", "page(1)", "Next steps", show=False),
        Binding("left_square_bracket", "page(-1)", "Previous steps", show=False),
    ]

    class RunLoaded(Message):
        def __init__(self, summary: RunSummary, found: list[Finding], facts: FindingFacts):
            super().__init__()
            self.summary = summary
            self.found = found
            self.facts = facts

    class StepsLoaded(Message):
        def __init__(self, start: int, steps: list[StepRow], total: int, cursor: int | None):
            super().__init__()
            self.start = start
            self.steps = steps
            self.total = total
            self.cursor = cursor  # the row to put the cursor on (a jump), else None

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
        self.num_steps = 0  # steps the filter keeps
        self.summary: RunSummary | None = None
        self.order = StepOrder()
        self.where: StepFilter | None = None
        self.asking: str | None = None  # "filter" or "jump" while the input is open

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(plain(f"run {self.run_id}: loading…"), id="run-title", markup=False)
        with TabbedContent(initial="summary"):
            with TabPane("summary", id="summary"), VerticalScroll(id="summary-scroll"):
                yield Static("", id="summary-body")
            with TabPane("steps", id="steps"):
                yield MeasuredTable(id="steps-table", cursor_type="row", zebra_stripes=True)
                yield Input(id="steps-input")
                yield Static("", id="steps-note", markup=False)
            with TabPane("requests", id="requests"):
                yield RequestView(self.db_path, self.run_id, id="requests-view")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#steps-table", DataTable)
        for key, label in STEP_COLUMNS:
            table.add_column(label, key=key)
        self.query_one("#steps-input", Input).display = False
        self.query_one("#summary-scroll").focus()  # arrow keys scroll the summary
        self.load_run()

    @work(thread=True, exclusive=True, group="run")
    def load_run(self) -> None:
        try:
            with Store.open(self.db_path, read_only=True) as store:
                store.resolve_run(self.run_id)  # a live run: "still running", not "no run"
                s = run_summary(store, self.run_id)
                facts = finding_facts(store, self.run_id, include_perturbed=s.includes_perturbed)
                self.post_message(self.RunLoaded(s, findings(s, facts), facts))
                steps, total = load_steps(store, self.run_id, 0, run_queries.STEP_PAGE)
        except (StoreError, duckdb.Error) as exc:
            self.post_message(self.LoadFailed(one_line(exc)))
            return
        self.post_message(self.StepsLoaded(0, steps, total, None))

    @work(thread=True, exclusive=True, group="steps")
    def load_page(self, start: int, jump_to: int | None = None) -> None:
        """A page of the step table as ordered and filtered now; with ``jump_to``, the page
        holding that step, the cursor on it."""
        order, where, cursor = self.order, self.where, None
        try:
            with Store.open(self.db_path, read_only=True) as store:
                if jump_to is not None:
                    pos = step_position(store, self.run_id, jump_to, order, where)
                    if pos is None:
                        why = "no such step" if where is None else f"not kept by {where.text}"
                        self.app.call_from_thread(self.notify, f"step {jump_to}: {why}")
                        return
                    start = pos - pos % run_queries.STEP_PAGE
                    cursor = pos - start
                steps, total = load_steps(
                    store, self.run_id, start, run_queries.STEP_PAGE, order, where
                )
        except (StoreError, duckdb.Error) as exc:
            self.post_message(self.LoadFailed(one_line(exc)))
            return
        self.post_message(self.StepsLoaded(start, steps, total, cursor))

    def on_run_screen_run_loaded(self, message: RunLoaded) -> None:
        s = self.summary = message.summary
        self.query_one("#run-title", Static).update(
            plain(f"run {s.run_id}  {s.label or ''}  [{s.status}]  {s.steps:,} steps")
        )
        body = summary_tables(s, message.found, facts=message.facts)
        self.query_one("#summary-body", Static).update(body)

    def on_run_screen_steps_loaded(self, message: StepsLoaded) -> None:
        self.page_start, self.num_steps = message.start, message.total
        table = self.query_one("#steps-table", DataTable)
        table.clear()
        table.add_rows(step_cells(r) for r in message.steps)
        if message.cursor is not None:
            table.move_cursor(row=message.cursor)
            table.focus()
        note = steps_note(self.order, self.where, message.start, len(message.steps), message.total)
        self.query_one("#steps-note", Static).update(note)
        self.loaded = True

    def action_page(self, direction: int) -> None:
        start = self.page_start + direction * run_queries.STEP_PAGE
        if self.loaded and 0 <= start < self.num_steps:
            self.load_page(start)

    def action_slowest_first(self) -> None:
        self._reorder(StepOrder() if self.order == SLOWEST_FIRST else SLOWEST_FIRST)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        field = str(event.column_key.value)
        if self.order.field == field:
            self._reorder(StepOrder(field, not self.order.descending))
        else:
            self._reorder(StepOrder(field, field in NUMERIC))

    def _reorder(self, order: StepOrder) -> None:
        self.order = order
        self.action_show_tab("steps")
        self.load_page(0)

    def action_ask(self, what: str) -> None:
        self.action_show_tab("steps")
        self.asking = what
        box = self.query_one("#steps-input", Input)
        box.placeholder = PROMPTS[what]
        box.value = self.where.text if what == "filter" and self.where else ""
        box.display = True
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        what, value = self.asking, event.value.strip()
        if what == "jump":
            if not value.isdigit():
                self.notify(f"{value!r} is not a step number", severity="warning")
                return
            self._close_input()
            self.load_page(0, jump_to=int(value))
        elif what == "filter":
            try:
                self.where = parse_step_filter(value)
            except ValueError as exc:
                self.notify(markup_safe(str(exc)), title="filter", severity="warning")
                return
            self._close_input()
            self.load_page(0)

    def _close_input(self) -> None:
        self.asking = None
        self.query_one("#steps-input", Input).display = False
        self.query_one("#steps-table").focus()

    def action_back(self) -> None:
        if self.asking is not None:
            self._close_input()
        else:
            self.app.pop_screen()

    def on_run_screen_load_failed(self, message: LoadFailed) -> None:
        self.loaded = True
        self.query_one("#run-title", Static).update(plain(f"run {self.run_id}: {message.error}"))
        self.notify(markup_safe(message.error), title="cannot read the run", severity="error")

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        """Whichever way a tab was chosen, its content takes the keys (scrolling, cursor)."""
        targets = {"steps": "#steps-table", "requests": "#requests-table"}
        self.query_one(targets.get(event.pane.id or "", "#summary-scroll")).focus()
