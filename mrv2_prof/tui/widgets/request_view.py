"""The run screen's requests tab: a table of the run's requests and, under it, the one under the
cursor in full (its prompt, its output and when each output token came).

The table shows each request's id, the prompt's last user message (or its end) and the start of
its output (decoded text; "—" on a run without a tokenizer), TTFT, E2E, its token counts and
finish. It holds the first ``REQUEST_PAGE`` requests in arrival order; a click on a header sorts
by that column in SQL (numbers biggest first, again: the other way), so "slowest first" covers
the whole run. Everything is read by worker threads (``store.request_list``).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import DataTable, Static

from mrv2_prof.analysis.request_list import RequestRow, request_page, token_times
from mrv2_prof.store import Store, StoreError
from mrv2_prof.tui.widgets.measured_table import MeasuredTable
from mrv2_prof.views.format import NO_VALUE, format_ms, one_line
from mrv2_prof.views.request_text import asked, head
from mrv2_prof.views.safe_text import markup_safe, plain

REQUEST_PAGE = 1_000
# (key, label): a key of ``store.request_list.ORDERS`` sorts by that column; None does not sort
COLUMNS = (
    ("req_id", "request"),
    (None, "asked"),
    (None, "answer"),
    ("ttft", "TTFT"),
    ("e2e", "E2E"),
    ("output_tokens", "tokens"),
    ("finish", "finish"),
)
NUMERIC = ("ttft", "e2e", "output_tokens")  # sorted biggest first on the first click
CELL_CHARS = 22  # of the asked and answer cells
DETAIL_CHARS = 4_000  # of the prompt and the output under the table
DETAIL_TOKENS = 200  # output tokens listed with their times


def request_cells(r: RequestRow) -> tuple[str, ...]:
    question = NO_VALUE if r.prompt_text is None else asked(r.prompt_text, CELL_CHARS)
    answer = NO_VALUE if r.output_text is None else head(r.output_text, CELL_CHARS)
    tokens = f"{r.prompt_tokens or 0:,}→{r.output_tokens or 0:,}"
    return (
        markup_safe(r.req_id, 24),
        markup_safe(question),
        markup_safe(answer),
        format_ms(r.ttft_ms),
        format_ms(r.e2e_ms),
        tokens,
        markup_safe(r.finish_reason or "unfinished"),
    )


def _block(text: str, from_end: bool) -> str:
    """A text as lines without control characters, cut to ``DETAIL_CHARS`` (its end or start)."""
    if len(text) > DETAIL_CHARS:
        text = "…" + text[-DETAIL_CHARS:] if from_end else text[:DETAIL_CHARS] + "…"
    return "\n".join("  " + plain(line) for line in text.splitlines() or [""])


def request_detail(r: RequestRow, tokens: list[tuple[int, int | None, int]]) -> str:
    """The request in full, as plain text: its numbers, prompt, output and token times (ms
    after its arrival, the gap to the token before, the token id)."""
    lines = [
        f"request {plain(r.req_id)}  {plain(r.finish_reason or 'unfinished')}  "
        f"TTFT {format_ms(r.ttft_ms)}  TPOT {format_ms(r.tpot_ms)}  E2E {format_ms(r.e2e_ms)}  "
        f"{r.prompt_tokens or 0:,} prompt, {r.output_tokens or 0:,} output tokens",
        "prompt:" if r.prompt_text is not None else "prompt: — (no text: no tokenizer)",
    ]
    if r.prompt_text is not None:
        lines.append(_block(r.prompt_text, from_end=True))
    if r.output_text is not None:
        lines += ["output:", _block(r.output_text, from_end=False)]
    else:
        why = "unfinished" if r.finish_reason is None else "no tokenizer"
        lines.append(f"output: — ({why})")
    times, last = [], None
    for idx, t_ns, token_id in tokens[:DETAIL_TOKENS]:
        if t_ns is None or r.arrival_ns is None:
            times.append(f"#{idx} ? (id {token_id})")
            continue
        gap = "" if last is None else f" +{format_ms((t_ns - last) / 1e6)}"
        times.append(f"#{idx} {format_ms((t_ns - r.arrival_ns) / 1e6)}{gap} (id {token_id})")
        last = t_ns
    more = f" … {len(tokens) - DETAIL_TOKENS:,} more" if len(tokens) > DETAIL_TOKENS else ""
    lines.append("tokens (after arrival, gap, id): " + (" · ".join(times) or NO_VALUE) + more)
    return "\n".join(lines)


class RequestView(Vertical):
    class PageLoaded(Message):
        def __init__(self, rows: list[RequestRow], total: int) -> None:
            super().__init__()
            self.rows, self.total = rows, total

    class DetailLoaded(Message):
        def __init__(self, req_id: str, text: str) -> None:
            super().__init__()
            self.req_id, self.text = req_id, text

    def __init__(self, db_path: Path, run_id: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.db_path, self.run_id = db_path, run_id
        self.order, self.descending = "arrival", False
        self.loaded = False  # a page and the first request's detail are in (or failed)
        self.rows: dict[str, RequestRow] = {}

    def compose(self) -> ComposeResult:
        yield MeasuredTable(id="requests-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="requests-note", markup=False)
        with VerticalScroll(id="request-detail-scroll"):
            yield Static("", id="request-detail", markup=False)

    def on_mount(self) -> None:
        table = self.query_one("#requests-table", DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key or label)
        self.load_page()

    @work(thread=True, exclusive=True, group="requests")
    def load_page(self) -> None:
        try:
            with Store.open(self.db_path, read_only=True) as store:
                rows, total = request_page(
                    store, self.run_id, 0, REQUEST_PAGE, self.order, self.descending
                )
        except (StoreError, duckdb.Error) as exc:
            self.post_message(self.DetailLoaded("", f"cannot read the requests: {one_line(exc)}"))
            return
        self.post_message(self.PageLoaded(rows, total))

    @work(thread=True, exclusive=True, group="request-detail")
    def load_detail(self, req_id: str) -> None:
        r = self.rows[req_id]
        try:
            with Store.open(self.db_path, read_only=True) as store:
                tokens = token_times(store, self.run_id, req_id)
        except (StoreError, duckdb.Error) as exc:
            self.post_message(self.DetailLoaded(req_id, f"cannot read: {one_line(exc)}"))
            return
        self.post_message(self.DetailLoaded(req_id, request_detail(r, tokens)))

    def on_request_view_page_loaded(self, message: PageLoaded) -> None:
        self.rows = {r.req_id: r for r in message.rows}
        table = self.query_one("#requests-table", DataTable)
        table.clear()
        for r in message.rows:
            table.add_row(*request_cells(r), key=r.req_id)
        shown, total = len(message.rows), message.total
        order = "" if self.order == "arrival" else f"sorted by {self.order}; "
        note = f"{order}{total:,} requests"
        if shown < total:
            note = f"{order}the first {shown:,} of {total:,} requests"
        self.query_one("#requests-note", Static).update(note + "  ·  click a header to sort")
        if not message.rows:
            self.query_one("#request-detail", Static).update("no requests stored")
            self.loaded = True

    def on_request_view_detail_loaded(self, message: DetailLoaded) -> None:
        self.query_one("#request-detail", Static).update(message.text)
        self.loaded = True

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.row_key.value in self.rows:
            self.load_detail(event.row_key.value)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()  # the run screen sorts its step table on its own headers
        key = str(event.column_key.value)
        if key not in {k for k, _ in COLUMNS if k}:
            return
        if self.order == key:
            self.descending = not self.descending
        else:
            self.order, self.descending = key, key in NUMERIC
        self.loaded = False
        self.load_page()
