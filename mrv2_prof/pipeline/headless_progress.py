"""A headless run's progress: a rich progress bar on a terminal, else plain progress lines (CI
logs, a file); both end with the whole run's rate.

The bar shows the rate of the latest snapshot interval while the run goes. The plain progress
is one line every ``interval_s`` seconds: the time since the first step, requests done (finished
or aborted) of the workload's total, output tokens, the rate over the run so far (output tokens /
time since the first step) and an ETA (tokens left / that rate, tokens left being each
unfinished request's max_tokens less its tokens so far, ``Snapshot.tokens_left``: a stop token
ends a request sooner, so the ETA errs long). A legend says so once, before the first line.
Until the first snapshot the line says the runner is still starting.

Either ends with the whole run's rate read from the store: output tokens / serving time,
the summary's own figures (``store.metrics.run_summary``), partial for a stopped run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mrv2_prof.analysis.metrics import RunSummary, run_summary
from mrv2_prof.store import Store, StoreError
from mrv2_prof.views.format import format_duration
from mrv2_prof.views.snapshot import Snapshot

LEGEND = (
    "progress every {every}: time since the first step; requests done (finished or aborted) / "
    "total; tok/s = output tokens / time since the first step; ETA = max_tokens left / that "
    "rate (long when requests stop early)"
)


class Heartbeat:
    """When the next line is due: every ``interval_s`` seconds (0: never)."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.clock = interval_s, clock
        self.started = clock()
        self.next = self.started + interval_s
        self.legend_shown = False
        self._shown: Snapshot | None = None  # the snapshot of the last line

    def due(self) -> bool:
        """True once per interval (the interval counts from the previous line's due time)."""
        if self.interval_s <= 0:
            return False
        now = self.clock()
        if now < self.next:
            return False
        while self.next <= now:
            self.next += self.interval_s
        return True

    def lines(self, snap: Snapshot | None) -> list[str]:
        """The line for ``snap`` (the newest snapshot, None before the first), with the legend
        before the first line of the run; none when no snapshot came since the last line."""
        if snap is None:
            waited = self.clock() - self.started
            return [f"starting: {format_duration(waited)} since launch (loading the model)"]
        if snap is self._shown:
            return []
        out = [] if self.legend_shown else [LEGEND.format(every=format_duration(self.interval_s))]
        self.legend_shown, self._shown = True, snap
        return [*out, heartbeat_line(snap)]


def eta_s(snap: Snapshot) -> float | None:
    """Seconds until every request is done at the rate so far; None before a token or when the
    tokens left are not known."""
    if snap.tokens_left is None or snap.output_tokens == 0 or snap.elapsed_s <= 0:
        return None
    return snap.tokens_left / (snap.output_tokens / snap.elapsed_s)


def heartbeat_line(snap: Snapshot) -> str:
    rate = snap.output_tokens / snap.elapsed_s if snap.elapsed_s > 0 else 0.0
    eta = eta_s(snap)
    return (
        f"{format_duration(snap.elapsed_s)}  requests {snap.num_done:,}/{snap.num_requests:,}  "
        f"output tokens {snap.output_tokens:,}  {rate:,.1f} tok/s  "
        f"ETA {'-' if eta is None else format_duration(eta)}"
    )


def run_rate(s: RunSummary) -> str:
    """The whole run's rate, as the summary computes it, saying how."""
    span = "first arrival to last finish"
    if s.partial:
        span = "first arrival to the last token before the stop"
    return (
        f"{s.output_tokens_per_s:,.1f} tok/s over the run ({s.output_tokens:,} output tokens / "
        f"{s.duration_s:,.2f} s serving time, {span})"
    )


def final_line(s: RunSummary, total: int | None) -> str:
    """The line a run's plain progress ends with; ``total``: the workload's requests."""
    done = s.num_completed + s.num_aborted
    what = f"stopped ({s.status}, partial)" if s.partial else "done"
    of = f"/{total:,}" if total is not None else ""
    return f"{what}: requests {done:,}{of} done, {run_rate(s)}"


def whole_run(db_path: str | Path, run_id: str | None) -> RunSummary | str | None:
    """Run ``run_id``'s summary once the run ended; None without a run or a step (nothing to
    rate; the run's own error says why); the reason as text when the store cannot tell."""
    if run_id is None:
        return None
    try:
        with Store.open(db_path, read_only=True) as store:
            s = run_summary(store, run_id)
    except StoreError as exc:
        return f"the run's rate cannot be read: {exc}"
    return s if s.steps else None


def with_progress_bar(runner, console: Console) -> None:
    """The bar shows the latest interval's rate while the run goes, the whole run's at the end."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("loading", total=None, stats="")
        runner.start()
        while not runner.done:
            runner.pump(0.2)
            snap, _ = runner.poll()
            if snap is not None:
                progress.update(
                    task,
                    description="requests",
                    total=snap.num_requests,
                    completed=snap.num_done,
                    stats=_progress_stats(snap),
                )
        runner.join()
        whole = whole_run(runner.job.db_path, runner.outcome.run_id if runner.outcome else None)
        if whole is not None:
            shown = whole if isinstance(whole, str) else _bar_rate(whole)
            progress.update(task, stats=shown)


def with_progress_lines(runner, console: Console, heartbeat_s: float) -> None:
    """Not a terminal: a plain line every ``heartbeat_s`` seconds, then the whole run's."""
    heartbeat = Heartbeat(heartbeat_s)
    latest: Snapshot | None = None
    runner.start()
    while not runner.done:
        runner.pump(0.2)
        snap, _ = runner.poll()
        latest = snap if snap is not None else latest
        if heartbeat.due():
            for line in heartbeat.lines(latest):
                console.print(line, markup=False, highlight=False, soft_wrap=True)
    runner.join()
    whole = whole_run(runner.job.db_path, runner.outcome.run_id if runner.outcome else None)
    if whole is not None:
        total = (runner.facts or {}).get("num_requests")
        text = f"note: {whole}" if isinstance(whole, str) else final_line(whole, total)
        console.print(text, markup=False, highlight=False, soft_wrap=True)


def _bar_rate(s: RunSummary) -> str:
    """The bar's last words: the whole run's rate (the summary under it gives the figures)."""
    partial = ", partial" if s.partial else ""
    return (
        f"{s.output_tokens_per_s:7.1f} tok/s over the run (output tokens / serving time{partial})"
    )


def _progress_stats(s: Snapshot) -> str:
    ttft = f"{s.ttft_ms_p50:.0f}" if s.ttft_ms_p50 is not None else "-"
    return (
        f"{s.tokens_per_s:7.1f} tok/s  {s.steps_per_s:5.1f} steps/s  "
        f"run {s.num_running} wait {s.num_waiting}  TTFT p50 {ttft} ms  "
        f"KV {100 * s.kv_usage:3.0f}%"
    )
