"""Two runs side by side: every gate metric of A and B with B's change and its verdict.

What ``mrv2-prof compare`` prints, from the same functions, computed by a worker thread: the
sides (``analysis.run_sides``), each metric's change (coloured by its sign: better or worse) and
its verdict from the samples (``report.metric_stats``: better, worse, within noise or
inconclusive; the line under the table gives the highlighted metric's interval, reason and
test), and above the table what differs between the two runs (``report.comparability``: the
scenario as run, model, device, environment) in the CLI's words. When the screen is too narrow
for every column, the ``B − A`` column is left out (the % change and the verdict stay), so no
value is cut.
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

from mrv2_prof.analysis.gate_metrics import LOWER, METRICS, RunMetrics
from mrv2_prof.analysis.run_sides import load_sides
from mrv2_prof.report.comparability import Comparability, check
from mrv2_prof.report.compare import format_pct
from mrv2_prof.report.metric_stats import MetricStat, metric_stats
from mrv2_prof.store import StoreError
from mrv2_prof.tui.widgets.measured_table import MeasuredTable
from mrv2_prof.views.format import one_line
from mrv2_prof.views.safe_text import markup_safe, plain

SIGN_STYLE = {"better": "green", "worse": "red", "same": "", None: "dim"}  # the change's sign
VERDICT_STYLE = {"better": "green", "worse": "red", "inconclusive": "yellow"}  # from the samples
CAPTION = "lower is better except ↑ · '-' = not measured · the verdict under the cursor: below"
NARROW_NOTE = " (too narrow for the verdicts' notes: there)"
MAX_WARNINGS = 4  # lines of differences shown above the table; the rest are counted


def run_line(tag: str, run: RunMetrics) -> str:
    status = run.status + (f": {run.error}" if run.error else "")
    return f"{tag} = {run.run_id}  {run.label or ''}  [{status}]"


def warning_lines(a: RunMetrics, b: RunMetrics, comp: Comparability) -> list[str]:
    """What ``mrv2-prof compare`` says under its table about the two runs: each difference
    (``differs: scenario: …``), what could not be checked, the perturbed steps left out."""
    lines = [f"differs: {d.describe()}" for d in comp.differences]
    lines += [f"not checked: {u}" for u in comp.unchecked]
    lines += [
        f"note: run {r.run_id}: {r.perturbed_steps} perturbed steps (traced or capturing) left "
        "out of overlap, bubbles, syncs and ITL"
        for r in (a, b)
        if r.perturbed_steps
    ]
    return lines


def shown_warnings(lines: list[str], a: str, b: str) -> str:
    """At most ``MAX_WARNINGS`` lines (each made plain), then how many more and where they are
    all listed."""
    if len(lines) > MAX_WARNINGS:
        more = len(lines) - MAX_WARNINGS + 1
        lines = [*lines[: MAX_WARNINGS - 1], f"… and {more} more: mrv2-prof compare {a} {b}"]
    return "\n".join(plain(line) for line in lines)


class CompareScreen(Screen[None]):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    class CompareLoaded(Message):
        def __init__(
            self, a: RunMetrics, b: RunMetrics, stats: list[MetricStat], comp: Comparability
        ) -> None:
            super().__init__()
            self.a = a
            self.b = b
            self.stats = stats
            self.comp = comp

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
        self.stats: dict[str, MetricStat] = {}  # metric name -> its change and verdict
        self.warnings: list[str] = []  # what differs between the runs, as compare says it
        self.with_delta = True  # the B − A column is shown (it fits)
        self.full_verdicts = True  # each verdict with its note, as compare shows it (it fits)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(
            f"A = {plain(self.run_a)}\nB = {plain(self.run_b)}  (loading…)",
            id="compare-title",
            markup=False,
        )
        yield Static("", id="compare-warnings", markup=False)
        yield MeasuredTable(id="compare-table", cursor_type="row", zebra_stripes=True)
        yield Static(CAPTION, id="compare-caption", markup=False)
        yield Static("", id="compare-verdict", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self._fill()
        self.load_metrics()

    def _rows(self, full: bool = True) -> list[tuple[str, Text, Text, Text, Text, Text]]:
        """The table's rows; ``full``: each verdict as compare shows it (with its note, such as
        why it is inconclusive), else the verdict alone (the note is in the line below)."""
        rows = []
        for d in self.stats.values():
            m = METRICS[d.name]
            style = SIGN_STYLE[d.direction]
            change = "-" if d.delta is None else m.format_delta(d.delta)
            rows.append((
                d.name + ("" if m.direction == LOWER else " ↑"),
                Text(m.format(d.a), justify="right"), Text(m.format(d.b), justify="right"),
                Text(change, style, justify="right"),
                Text(format_pct(d.delta_pct, d.delta), style, justify="right"),
                Text(d.shown if full else d.stat.verdict, VERDICT_STYLE.get(d.stat.verdict, "")),
            ))  # fmt: skip
        return rows

    def _fits(self, rows: list, with_delta: bool) -> bool:
        """Whether every column (B − A only ``with_delta``) fits the screen's width (cells
        padded by one each side, a scrollbar)."""
        headers = ("metric", f"A {self.run_a}", f"B {self.run_b}", "B − A", "%", "verdict")
        widths = [2 + max([len(h)] + [len(str(r[i])) for r in rows]) for i, h in enumerate(headers)]
        return sum(widths) - (0 if with_delta else widths[3]) + 2 <= self.size.width

    def _layout(self) -> tuple[bool, bool]:
        """(B − A shown, verdicts in full): the most that fits, B − A going first."""
        full = self._rows()
        if self._fits(full, with_delta=True):
            return True, True
        return False, self._fits(full, with_delta=False)

    def _fill(self) -> None:
        """The table anew: the rows once the metrics are in, B − A and the verdicts' notes only
        if they fit."""
        self.with_delta, self.full_verdicts = self._layout()
        rows = self._rows(self.full_verdicts)
        table = self.query_one("#compare-table", DataTable)
        table.clear(columns=True)
        table.add_column("metric", key="metric")
        table.add_column(f"A {self.run_a}", key="a")
        table.add_column(f"B {self.run_b}", key="b")
        if self.with_delta:
            table.add_column("B − A", key="delta")
        table.add_column("%", key="pct")
        table.add_column("verdict", key="verdict")
        for name, a, b, delta, pct, verdict in rows:
            cells = (name, a, b, *([delta] if self.with_delta else []), pct, verdict)
            table.add_row(*cells, key=name.removesuffix(" ↑"))
        caption = CAPTION if self.full_verdicts else CAPTION + NARROW_NOTE
        self.query_one("#compare-caption", Static).update(caption)

    def on_resize(self, event: events.Resize) -> None:
        if self._layout() != (self.with_delta, self.full_verdicts):
            self._fill()

    @work(thread=True, exclusive=True, group="compare")
    def load_metrics(self) -> None:
        """Both sides, each metric's verdict and what differs, as ``mrv2-prof compare``."""
        try:
            a, b = load_sides(self.db_path, self.run_a, self.db_path, self.run_b)
            stats, comp = metric_stats(a, b), check(a, b)
        except (StoreError, duckdb.Error) as exc:
            self.post_message(self.LoadFailed(one_line(exc)))
            return
        self.post_message(self.CompareLoaded(a.as_run(), b.as_run(), stats, comp))

    def on_compare_screen_compare_loaded(self, message: CompareLoaded) -> None:
        a, b = message.a, message.b
        title = f"{plain(run_line('A', a))}\n{plain(run_line('B', b))}"
        self.query_one("#compare-title", Static).update(title)
        self.runs = (a, b)
        self.stats = {s.name: s for s in message.stats}
        self.warnings = warning_lines(a, b, message.comp)
        shown = shown_warnings(self.warnings, self.run_a, self.run_b)
        box = self.query_one("#compare-warnings", Static)
        box.update(shown)
        box.display = bool(self.warnings)
        self._fill()
        self.loaded = True

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """Under the table, how the highlighted metric's verdict follows from its samples."""
        stat = self.stats.get(str(event.row_key.value))
        if stat is not None:
            line = f"{stat.name}: {stat.stat.describe()}; test: {stat.test}"
            self.query_one("#compare-verdict", Static).update(plain(line))

    def on_compare_screen_load_failed(self, message: LoadFailed) -> None:
        self.loaded = True
        self.query_one("#compare-title", Static).update(plain(f"cannot compare: {message.error}"))
        self.notify(markup_safe(message.error), title="cannot compare", severity="error")
