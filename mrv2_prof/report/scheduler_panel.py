"""The report's scheduler panel: the queue, the KV cache, preemptions and prefix-cache hits,
step by step (the counts the scheduler left in ``steps`` and ``requests.cached_tokens``).

Four rows on one step axis: requests waiting and running; KV blocks in use against the
cache's size; preemptions in each step and so far; the prefix-cache hit rate so far (cached
over prompt tokens of the requests that had their first token by that step).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mrv2_prof.analysis.run_data import RunData
from mrv2_prof.report.figure_meta import Figure, NotMeasured, new_figure

TITLE = "Scheduler: queue, KV cache, preemptions and prefix-cache hits per step"


def _counts(data: RunData, name: str) -> np.ndarray:
    values = data.steps.get(name)
    if values is None:
        return np.full(data.num_steps, np.nan)
    return values.astype(np.float64)


def prefix_hit_rate_by_step(data: RunData) -> tuple[np.ndarray, np.ndarray]:
    """(step, cumulative hit rate) at each step where a request had its first token: cached
    over prompt tokens of every request whose first token came by the end of that step."""
    hits, steps = data.prefix_hits, data.steps
    if len(hits.get("first_token_ns", ())) == 0 or data.num_steps == 0:
        return np.array([], dtype=np.int64), np.array([])
    ends = steps["cpu_end_ns"].astype(np.float64)
    order = np.argsort(ends, kind="stable")
    at = np.searchsorted(ends[order], hits["first_token_ns"].astype(np.float64), side="left")
    at = np.minimum(at, data.num_steps - 1)
    step_of = steps["step"][order][at].astype(np.int64)
    prompt = np.cumsum(hits["prompt_tokens"].astype(np.float64))
    cached = np.cumsum(hits["cached_tokens"].astype(np.float64))
    last = np.r_[step_of[1:] != step_of[:-1], True]  # the last request of each step
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(prompt > 0, cached / prompt, np.nan)
    return step_of[last], rate[last]


def scheduler(data: RunData) -> Figure:
    if data.num_steps == 0:
        return NotMeasured("scheduler", TITLE, "the run has no steps")
    waiting, running = _counts(data, "num_waiting"), _counts(data, "num_running")
    kv, preempted = _counts(data, "kv_used_blocks"), _counts(data, "num_preempted")
    if all(np.all(np.isnan(c)) for c in (waiting, running, kv, preempted)):
        why = "the steps carry no scheduler counts (a run database from before they were stored)"
        return NotMeasured("scheduler", TITLE, why)
    step = data.steps["step"]
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.05)
    fig.add_trace(go.Scattergl(x=step, y=waiting, mode="lines", name="waiting"), row=1, col=1)
    fig.add_trace(go.Scattergl(x=step, y=running, mode="lines", name="running"), row=1, col=1)
    fig.add_trace(go.Scattergl(x=step, y=kv, mode="lines", name="KV blocks used"), row=2, col=1)
    total_blocks = data.info.get("num_kv_blocks")
    if isinstance(total_blocks, int) and total_blocks > 0:
        fig.add_hline(y=total_blocks, line_dash="dash", row=2, col=1,
                      annotation_text=f"{total_blocks:,} blocks")  # fmt: skip
    per_step = np.nan_to_num(preempted)
    hit = per_step > 0
    fig.add_trace(
        go.Scattergl(x=step[hit], y=per_step[hit], mode="markers", name="preempted in the step",
                     marker={"size": 5, "color": "#E45756"}),
        row=3, col=1,
    )  # fmt: skip
    fig.add_trace(
        go.Scattergl(x=step, y=np.cumsum(per_step), mode="lines", name="preemptions so far",
                     line={"color": "#B279A2"}),
        row=3, col=1,
    )  # fmt: skip
    hit_step, hit_rate = prefix_hit_rate_by_step(data)
    fig.add_trace(
        go.Scattergl(x=hit_step, y=hit_rate * 100, mode="lines", line_shape="hv",
                     name="prefix-cache hit rate so far"),
        row=4, col=1,
    )  # fmt: skip
    for row, label in enumerate(("requests", "KV blocks", "preemptions", "prefix hit %"), 1):
        fig.update_yaxes(title_text=label, row=row, col=1)
    fig.update_yaxes(range=[0, 102], row=4, col=1)
    fig.update_xaxes(title_text="step", row=4, col=1)
    fig.update_layout(height=800)
    facts = _facts(step, waiting, running, kv, per_step, hit_rate, total_blocks)
    return new_figure(fig, "scheduler", TITLE, _notes(facts), **facts)


def _peak(values: np.ndarray) -> int | None:
    return None if np.all(np.isnan(values)) else int(np.nanmax(values))


def _facts(step, waiting, running, kv, per_step, hit_rate, total_blocks) -> dict:
    first = int(step[per_step > 0][0]) if (per_step > 0).any() else None
    return {
        "num_preemptions": int(per_step.sum()),
        "first_preemption_step": first,
        "peak_waiting": _peak(waiting),
        "peak_running": _peak(running),
        "peak_kv_blocks": _peak(kv),
        "num_kv_blocks": total_blocks if isinstance(total_blocks, int) else None,
        "prefix_hit_rate": float(hit_rate[-1]) if len(hit_rate) else None,
    }


def _notes(f: dict) -> list[str]:
    notes = []
    if f["num_preemptions"]:
        notes.append(
            f"{f['num_preemptions']:,} preemptions, the first at step {f['first_preemption_step']}"
        )
    else:
        notes.append("no preemptions: the KV cache always had room")
    if f["peak_kv_blocks"] is not None and f["num_kv_blocks"]:
        share = f["peak_kv_blocks"] / f["num_kv_blocks"]
        notes.append(
            f"KV blocks: peak {f['peak_kv_blocks']:,} of {f['num_kv_blocks']:,} ({share:.1%})"
        )
    if f["peak_waiting"] is not None and f["peak_running"] is not None:
        notes.append(f"queue: at most {f['peak_waiting']:,} waiting, {f['peak_running']:,} running")
    if f["prefix_hit_rate"] is not None:
        notes.append(f"prefix cache: {f['prefix_hit_rate']:.1%} of prompt tokens hit")
    return notes
