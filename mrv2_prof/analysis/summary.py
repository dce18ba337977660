"""The summary tables a run ends with (and ``show`` prints again), built from the store.

Returns rich renderables; the CLI prints them. Numbers come from ``store.metrics`` only, so the
live run, ``show`` and the tests all read the same definitions. The summary opens with the
run's findings, ranked (``mrv2_prof.analysis.findings``).
"""

from __future__ import annotations

import datetime as dt
import json

from rich.console import Group
from rich.table import Table
from rich.text import Text

from mrv2_prof.analysis.energy import energy_rows
from mrv2_prof.analysis.finding_facts import FindingFacts, finding_facts
from mrv2_prof.analysis.findings import Finding, findings
from mrv2_prof.analysis.metrics import Percentiles, RunSummary, run_summary
from mrv2_prof.analysis.rank_steps import rank_line
from mrv2_prof.analysis.request_list import first_answers
from mrv2_prof.analysis.roofline import roofline_line
from mrv2_prof.store import Store
from mrv2_prof.views.downgrades import matrix_cell, stored_runner_downgrades
from mrv2_prof.views.environment import environment_line
from mrv2_prof.views.format import format_bytes
from mrv2_prof.views.memory_line import memory_rows
from mrv2_prof.views.model_line import model_line, model_name
from mrv2_prof.views.request_text import asked, head
from mrv2_prof.views.safe_text import markup_safe, plain
from mrv2_prof.views.staged_writes import staged_writes_text
from mrv2_prof.views.startup_line import startup_line


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _pct_row(name: str, p: Percentiles) -> tuple[str, ...]:
    return (name, _ms(p.p50), _ms(p.p90), _ms(p.p95), _ms(p.p99), _ms(p.mean), str(p.count))


def _graphs(s: RunSummary) -> str:
    if s.graph_hit_rate is None:
        return "-"
    rate = 100 * s.graph_hit_rate
    shown = f"{rate:.0f}" if rate in (0, 100) or 1 <= rate <= 99 else f"{rate:.1f}"
    text = f"{shown}% of steps replayed a graph"
    if s.graph_hit_rate > 0:
        text += " (" + ", ".join(f"{m} {n}" for m, n in s.graph_modes.items()) + ")"
    if s.graph_fallback_reason:
        text += f"; most fallbacks: {markup_safe(s.graph_fallback_reason)}"
    num_graphs = s.info.get("num_graphs", 0)
    if num_graphs:
        text += (
            f"; {num_graphs} keys captured in {s.info.get('capture_s', 0):.1f} s, "
            f"{format_bytes(s.info.get('graph_memory_bytes', 0))}"
        )
        replayed = s.info.get("graph_keys_replayed")
        if replayed is not None:
            text += (
                f", {num_graphs - replayed} never replayed "
                f"({s.info.get('unused_capture_s', 0):.1f} s, "
                f"{format_bytes(s.info.get('unused_graph_bytes', 0))})"
            )
    sampled_in_graph = s.info.get("sample_graph_replays")
    if sampled_in_graph is not None:  # runner.full_step_graph
        steps = "step" if sampled_in_graph == 1 else "steps"
        text += (
            f"; {sampled_in_graph:,} FULL decode {steps} sampled in a graph (every FULL decode "
            "step builds its inputs in its graph)"
        )
    return text


def _overlap(s: RunSummary) -> str:
    if s.bubble_ms is None:
        return "- (no GPU timeline: probes.cuda_events off or a CPU run)"
    hidden = "-" if s.overlap is None else f"{100 * s.overlap:.1f}%"
    where, starved = "between steps", ""
    if s.starved_ms is not None:
        where, starved = "between and inside steps", f", {s.starved_ms:,.1f} ms inside steps"
    return (
        f"{hidden} of host prep hidden under GPU work; GPU idle {where} "
        f"{s.bubble_ms:,.1f} ms ({s.host_bound_bubble_ms:,.1f} ms waiting for the host{starved})"
    )


def _spec_decode(s: RunSummary) -> str:
    d = s.spec_decode
    per_position = " ".join(f"{100 * r:.0f}%" for r in d.acceptance_per_position)
    share = "-" if d.draft_time_share is None else f"{100 * d.draft_time_share:.1f}%"
    return (
        f"{d.num_drafts:,} drafts, {d.num_accepted_tokens:,} of {d.num_draft_tokens:,} tokens "
        f"accepted ({100 * d.acceptance_rate:.1f}%); mean acceptance length "
        f"{d.mean_acceptance_length:.2f}; per position {per_position}; draft {d.draft_ms:,.1f} "
        f"ms ({_track(d.draft_track)}) vs verify {d.verify_ms:,.1f} ms "
        f"({_track(d.verify_track)}): {share} drafting"
    )


def _spec_slots(s: RunSummary) -> str | None:
    """Draft slots reserved and reclaimed, and requests that sat out; None when not recorded."""
    d = s.spec_decode
    if d.reserved_slots is None:
        return None
    text = f"{d.reserved_slots:,} draft slots reserved, {d.reclaimed_slots or 0:,} reclaimed"
    if d.reclaimed_share is not None:
        text += f" ({100 * d.reclaimed_share:.1f}%)"
    if d.sat_out_steps:
        text += (
            f"; {d.sat_out_requests:,} requests sat out in {d.sat_out_steps:,} steps "
            "(drafts on the host)"
        )
    return text


def _dynamic_k(s: RunSummary) -> str | None:
    """Dynamic k's decisions: how often it turned speculation off, and what it measured."""
    d = s.spec_decode
    if not d.decided_steps:
        return None
    text = f"k = 0 in {d.k_off_steps:,} of {d.decided_steps:,} steps decided"
    for name, last, mean in (
        ("expected tokens", d.last_expected_tokens, d.mean_expected_tokens),
        ("cost ratio", d.last_cost_ratio, d.mean_cost_ratio),
    ):
        if last is not None:
            text += f"; {name} {last:.2f} last, {mean:.2f} mean"
    return text + " (pays where expected / cost > 1)"


def _track(track: str) -> str:
    """Where a spec-decode time was measured: the device's busy time, or the host's span."""
    return "gpu busy" if track == "gpu" else track


def _perturbed(s: RunSummary) -> str | None:
    if not s.perturbed_steps:
        return None
    if s.includes_perturbed:
        return f"{s.perturbed_steps} perturbed steps (traced or capturing) included"
    return (
        f"{s.perturbed_steps} perturbed steps (traced or capturing) left out of overlap, bubbles, "
        "syncs and ITL"
    )


def findings_text(found: list[Finding]) -> Text:
    """The ranked findings, one numbered line each with where to look under it."""
    text = Text("findings", style="bold")
    if not found:
        return text.append(": nothing stands out (no rule fired)\n", style="")
    marks = {2: ("!", "red"), 1: ("*", "yellow"), 0: ("-", "")}
    for i, f in enumerate(found, start=1):
        mark, style = marks.get(f.severity, ("-", ""))
        text.append(f"\n{i:>2}. ")
        text.append(mark, style=style)
        text.append(f" {plain(f.text)}\n      ")
        text.append(f"look at: {plain(f.where)}", style="dim")
    return text.append("\n")


def _staged(s: RunSummary, facts: FindingFacts | None) -> str:
    if facts is None:
        return staged_writes_text(s.staged_bytes, s.dense_bytes)
    runner = facts.scenario_as_run.get("runner")
    on = runner.get("staged_writes") if isinstance(runner, dict) else None
    return staged_writes_text(s.staged_bytes, s.dense_bytes, facts.staged_by_tensor, on)


def _serving_time(s: RunSummary) -> str:
    if s.partial:
        return f"{s.duration_s:,.2f} s (partial: first arrival to the last token before the stop)"
    return f"{s.duration_s:,.2f} s (first arrival to last finish)"


def _latency_title(s: RunSummary) -> str:
    if s.partial:
        return (
            "latency (ms), partial run: TTFT and ITL over the requests completed or in flight "
            "at the stop, TPOT and E2E over completed ones"
        )
    return "latency (ms, completed requests)"


def _model(info: dict, params: int | None) -> str:
    """The model's name (where it was read) and path, then its parameter count."""
    size = f"{params / 1e6:,.1f} M parameters" if params else "? parameters"
    line = model_line(info) or "name not recorded"
    return f"{line}; {size}"


def summary_tables(
    s: RunSummary,
    found: list[Finding] | None = None,
    shown_notes: tuple[str, ...] = (),
    facts: FindingFacts | None = None,
) -> Group:
    """The summary of ``s``, opened by ``found`` (its findings) when given; notes already in
    ``shown_notes`` (printed when the run started) are not printed again; ``facts`` (the
    run's ``finding_facts``) name the tensors still staged when staged writes were off."""
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    info = s.info or {}
    status = s.status if not s.error else f"{s.status} ({s.error})"
    params = info.get("model_params")
    rows = [
        ("run", markup_safe(f"{s.run_id}  {s.label}")),
        ("status", markup_safe(status)),
        ("device / dtype", markup_safe(f"{s.device} / {info.get('dtype', '?')}")),
        ("model", markup_safe(_model(info, params))),
        ("KV cache", f"{info.get('num_kv_blocks', '?')} blocks"),
        ("start-up", startup_line(info).removeprefix("start-up ")),
        (
            "requests",
            f"{s.num_requests} ({s.num_completed} completed, {s.num_aborted} aborted, "
            f"{s.num_unfinished} unfinished)",
        ),
        ("steps", f"{s.steps:,}"),
        ("tokens", f"{s.prompt_tokens:,} prompt, {s.output_tokens:,} output"),
        ("serving time", _serving_time(s)),
        (
            "throughput",
            f"{s.requests_per_s:,.2f} req/s, {s.output_tokens_per_s:,.1f} output tok/s "
            "(completed requests, output tokens / serving time)",
        ),
        ("preemptions", f"{s.num_preemptions}"),
        (
            "prefix cache",
            "-"
            if s.prefix_cache_hit_rate is None
            else f"{100 * s.prefix_cache_hit_rate:.1f}% of prompt tokens hit",
        ),
        ("staged writes", markup_safe(_staged(s, facts))),
        ("sync points", f"{s.num_syncs:,} waits, {s.sync_blocked_ms:,.1f} ms blocked"),
        ("CUDA graphs", _graphs(s)),
        ("CPU/GPU overlap", _overlap(s)),
    ]
    rows += [(k, markup_safe(v)) for k, v in memory_rows(info)]  # device memory at start-up
    if s.spec_decode is not None:
        rows.append(("spec decode", _spec_decode(s)))
        for name, line in (("spec slots", _spec_slots(s)), ("dynamic k", _dynamic_k(s))):
            if line is not None:
                rows.append((name, line))
    perturbed = _perturbed(s)
    if perturbed:
        rows.append(("perturbed", perturbed))
    if s.tensor_parallel is not None:
        rows.append(("tensor parallel", rank_line(s.tensor_parallel)))
    if s.roofline is not None and (s.roofline.summaries or s.device.startswith("cuda")):
        rows.append(("roofline", markup_safe(roofline_line(s.roofline))))
    rows += energy_rows(s.energy)  # NVML's energy counter (GPU runs)
    environment = environment_line(s.environment)
    if environment:
        rows.append(("environment", environment))
    for k, v in rows:
        head.add_row(k, v)
    lat = Table(title=_latency_title(s), title_justify="left")
    for col in ("metric", "p50", "p90", "p95", "p99", "mean", "n"):
        lat.add_column(col, justify="left" if col == "metric" else "right")
    lat.add_row(*_pct_row("TTFT", s.ttft_ms))
    lat.add_row(*_pct_row("TPOT", s.tpot_ms))
    lat.add_row(*_pct_row("ITL", s.itl_ms))
    lat.add_row(*_pct_row("E2E", s.e2e_ms))
    parts: list = [head, lat]
    if found is not None:
        parts.insert(0, findings_text(found))
    for note in info.get("notes", []):
        if note in shown_notes:
            continue
        parts.append(Text.assemble(("note ", "yellow"), plain(note)))
    return Group(*parts)


def render_summary(store: Store, run_id: str, shown_notes: tuple[str, ...] = ()) -> Group:
    """Findings first, then the summary tables (``shown_notes`` as in ``summary_tables``), then
    a few answers when the run decoded its requests' text."""
    s = run_summary(store, run_id)
    facts = finding_facts(store, run_id, include_perturbed=s.includes_perturbed)
    tables = summary_tables(s, findings(s, facts), shown_notes, facts)
    answers = answers_table(store, run_id)
    return tables if answers is None else Group(tables, answers)


ANSWERS, ANSWER_CHARS = 3, 120  # requests shown; characters of each text (two lines at 80)


def answers_table(store: Store, run_id: str) -> Table | None:
    """The first few answered requests: the prompt's last user message (or its end) and the
    output, each shortened to about two lines; None when the run has no decoded text."""
    rows, total = first_answers(store, run_id, ANSWERS)
    if not rows:
        return None
    t = Table.grid(padding=(0, 1), expand=True)
    t.title = f"answers (the first {len(rows)} of {total:,} requests with an output)"
    t.title_justify, t.title_style = "left", "bold"
    t.add_column(no_wrap=True)
    t.add_column(style="dim", no_wrap=True)
    t.add_column(ratio=1)
    for r in rows:
        question = asked(r.prompt_text, ANSWER_CHARS) if r.prompt_text else "-"
        t.add_row(Text(plain(r.req_id, 24)), "asked", Text(question))
        t.add_row("", "answer", Text(head(r.output_text or "", ANSWER_CHARS)))
    return t


_METRIC_COLUMNS = (
    "tok/s",
    "TTFT p50 ms",
    "ITL p50 ms",
    "ITL p99 ms",
    "E2E p50 ms",
    "staged / dense",
)


class _FittedTable:
    """A table whose columns are never narrower than the longest word of a value or header, so
    nothing is cut and text breaks between words only; on a console too narrow for the headers
    whole, a long snake_case header breaks after its ``_``. Built when rendered, for the width
    it gets. The first ``left`` columns are left-aligned, the rest right-aligned."""

    def __init__(self, title: str, headers: list[str], rows: list[list[str]], left: int):
        self.title, self.headers, self.rows, self.left = title, headers, rows, left

    def table(self, max_width: int) -> Table:
        natural = 1 + sum(
            3 + max([len(h)] + [len(r[i]) for r in self.rows]) for i, h in enumerate(self.headers)
        )
        t = Table(title=self.title, title_justify="left")
        for i, header in enumerate(self.headers):
            snake = len(header) > 10 and " " not in header and natural > max_width
            shown = header.replace("_", "_\n") if snake else header
            texts = [*shown.splitlines(), *(r[i] for r in self.rows)]
            width = max(len(w) for text in texts for w in text.split() or [""])
            t.add_column(shown, min_width=width, justify="left" if i < self.left else "right")
        for r in self.rows:
            t.add_row(*r)
        return t

    def __rich_console__(self, console, options):
        yield self.table(options.max_width)


def render_comparison(store: Store, run_ids: list[str]) -> Group:
    """One row per run of a matrix sweep; a column per matrix key holds its value, with what
    ran instead when the run downgraded it (``triton (ran torch)``); the status column only
    when a run did not complete. Under the table, one line per group of runs with the same
    downgrades of keys outside the matrix."""
    combos, downgraded, summaries = {}, {}, {}
    for rid in run_ids:
        row = store.connection.execute(
            "SELECT matrix_combo, scenario_given_yaml, scenario_yaml FROM runs WHERE run_id = ?",
            [rid],
        ).fetchone()
        combos[rid] = json.loads(row[0]) if row and row[0] else {}
        downgraded[rid] = stored_runner_downgrades(row[1], row[2]) if row else []
        summaries[rid] = run_summary(store, rid)
    keys = list(dict.fromkeys(k for c in combos.values() for k in c))
    with_status = any(s.status != "completed" for s in summaries.values())
    others: dict[str, list[str]] = {}
    rows = []
    for rid in run_ids:
        s, found = summaries[rid], downgraded[rid]
        ratio = f"{s.staged_bytes / s.dense_bytes:.4f}" if s.dense_bytes else "-"
        other = ", ".join(d.short for d in found if d.key not in combos[rid])
        if other:
            others.setdefault(other, []).append(rid)
        rows.append([
            s.run_id, *(markup_safe(matrix_cell(combos[rid].get(k), k, found)) for k in keys),
            *([markup_safe(s.status)] if with_status else []), f"{s.output_tokens_per_s:,.1f}",
            _ms(s.ttft_ms.p50), _ms(s.itl_ms.p50), _ms(s.itl_ms.p99), _ms(s.e2e_ms.p50), ratio,
        ])  # fmt: skip
    headers = ["run", *(markup_safe(k.rsplit(".", 1)[-1]) for k in keys)]
    headers += ["status"] * with_status + list(_METRIC_COLUMNS)
    t = _FittedTable("matrix", headers, rows, left=len(headers) - len(_METRIC_COLUMNS))
    lines = [
        Text.assemble(("ran as ", "yellow"), f"{plain(what)}: ", ", ".join(rids))
        for what, rids in others.items()
    ]
    return Group(t, *lines)


def render_runs(rows: list[dict], db: str) -> Table:
    t = Table(
        title=Text(f"runs in {plain(db)}"),
        title_justify="left",
        caption="wall time: the run's start to its end, start-up included (show gives the "
        "serving time: first arrival to last finish)",
        caption_justify="left",
    )
    cols = ("run", "label", "model", "status", "started", "wall time", "requests", "output tokens")
    for col in cols:
        t.add_column(col, justify="right" if col in ("requests", "output tokens") else "left")
    for r in rows:
        started = r.get("started_at")
        started_s = (
            started.strftime("%Y-%m-%d %H:%M:%S") if isinstance(started, dt.datetime) else ""
        )
        dur = ""
        if r.get("ended_ns") and r.get("started_ns"):
            dur = f"{(r['ended_ns'] - r['started_ns']) / 1e9:,.1f} s"
        status = r["status"] + (" (writer gone)" if r.get("writer_gone") else "")
        status = markup_safe(status + (f": {r['error']}" if r.get("error") else ""))
        label = r["label"] or ""
        if r.get("run_group"):  # one of the repeats of a combination (run --repeats N)
            label += f"  group:{r['run_group']} #{(r.get('repeat_index') or 0) + 1}"
        t.add_row(
            markup_safe(r["run_id"]), markup_safe(label),
            markup_safe(model_name(r.get("info")) or "-"), status, started_s, dur,
            str(r.get("num_requests") or 0),
            str(r.get("output_tokens") or 0),
        )  # fmt: skip
    return t
