"""The summary tables a run ends with (and ``show`` prints again), built from the store.

Returns rich renderables; the CLI prints them. Numbers come from ``store.metrics`` only, so the
live run, ``show`` and the tests all read the same definitions.
"""

from __future__ import annotations

import datetime as dt
import json

from rich.console import Group
from rich.table import Table
from rich.text import Text

from mrv2_prof.run_environment import environment_line
from mrv2_prof.store import Store
from mrv2_prof.store.metrics import Percentiles, RunSummary, run_summary
from mrv2_prof.views.format import format_bytes
from mrv2_prof.views.safe_text import markup_safe, plain


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


def _perturbed(s: RunSummary) -> str | None:
    if not s.perturbed_steps:
        return None
    if s.includes_perturbed:
        return f"{s.perturbed_steps} perturbed steps (kernel trace) included"
    return (
        f"{s.perturbed_steps} perturbed steps (kernel trace) left out of overlap, bubbles, "
        "syncs and ITL"
    )


def summary_tables(s: RunSummary) -> Group:
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
        ("model", f"{params / 1e6:,.1f} M parameters" if params else "?"),
        ("KV cache", f"{info.get('num_kv_blocks', '?')} blocks"),
        (
            "requests",
            f"{s.num_requests} ({s.num_completed} completed, {s.num_aborted} aborted, "
            f"{s.num_unfinished} unfinished)",
        ),
        ("steps", f"{s.steps:,}"),
        ("tokens", f"{s.prompt_tokens:,} prompt, {s.output_tokens:,} output"),
        ("duration", f"{s.duration_s:,.2f} s (first arrival to last finish)"),
        (
            "throughput",
            f"{s.requests_per_s:,.2f} req/s, {s.output_tokens_per_s:,.1f} output tok/s",
        ),
        ("preemptions", f"{s.num_preemptions}"),
        (
            "prefix cache",
            "-"
            if s.prefix_cache_hit_rate is None
            else f"{100 * s.prefix_cache_hit_rate:.1f}% of prompt tokens hit",
        ),
        (
            "staged writes",
            f"{format_bytes(s.staged_bytes)} moved vs {format_bytes(s.dense_bytes)} "
            "for dense copies",
        ),
        ("sync points", f"{s.num_syncs:,} waits, {s.sync_blocked_ms:,.1f} ms blocked"),
        ("CUDA graphs", _graphs(s)),
        ("CPU/GPU overlap", _overlap(s)),
    ]
    perturbed = _perturbed(s)
    if perturbed:
        rows.append(("perturbed", perturbed))
    environment = environment_line(s.environment)
    if environment:
        rows.append(("environment", environment))
    for k, v in rows:
        head.add_row(k, v)
    lat = Table(title="latency (ms, completed requests)", title_justify="left")
    for col in ("metric", "p50", "p90", "p95", "p99", "mean", "n"):
        lat.add_column(col, justify="left" if col == "metric" else "right")
    lat.add_row(*_pct_row("TTFT", s.ttft_ms))
    lat.add_row(*_pct_row("TPOT", s.tpot_ms))
    lat.add_row(*_pct_row("ITL", s.itl_ms))
    lat.add_row(*_pct_row("E2E", s.e2e_ms))
    parts: list = [head, lat]
    for note in info.get("notes", []):
        parts.append(Text.assemble(("note ", "yellow"), plain(note)))
    return Group(*parts)


def render_summary(store: Store, run_id: str) -> Group:
    return summary_tables(run_summary(store, run_id))


def render_comparison(store: Store, run_ids: list[str]) -> Table:
    """One row per run of a matrix sweep; a column per matrix key holds its value."""
    combos = {}
    for rid in run_ids:
        row = store.connection.execute(
            "SELECT matrix_combo FROM runs WHERE run_id = ?", [rid]
        ).fetchone()
        combos[rid] = json.loads(row[0]) if row and row[0] else {}
    keys = list(dict.fromkeys(k for c in combos.values() for k in c))
    t = Table(title="matrix", title_justify="left")
    t.add_column("run")
    for key in keys:
        t.add_column(markup_safe(key.rsplit(".", 1)[-1]), overflow="fold")
    t.add_column("status", no_wrap=True)
    for col in ("tok/s", "TTFT p50 ms", "ITL p50 ms", "ITL p99 ms", "E2E p50 ms"):
        t.add_column(col, justify="right")
    t.add_column("staged/dense", justify="right")
    for rid in run_ids:
        s = run_summary(store, rid)
        ratio = f"{s.staged_bytes / s.dense_bytes:.4f}" if s.dense_bytes else "-"
        values = [markup_safe(json.dumps(combos[rid].get(k)).strip('"')) for k in keys]
        t.add_row(
            s.run_id, *values, markup_safe(s.status), f"{s.output_tokens_per_s:,.1f}",
            _ms(s.ttft_ms.p50), _ms(s.itl_ms.p50), _ms(s.itl_ms.p99), _ms(s.e2e_ms.p50), ratio,
        )  # fmt: skip
    return t


def render_runs(rows: list[dict], db: str) -> Table:
    t = Table(title=Text(f"runs in {plain(db)}"), title_justify="left")
    for col in ("run", "label", "status", "started", "duration", "requests", "output tokens"):
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
            markup_safe(r["run_id"]), markup_safe(label), status, started_s, dur,
            str(r.get("num_requests") or 0),
            str(r.get("output_tokens") or 0),
        )  # fmt: skip
    return t
