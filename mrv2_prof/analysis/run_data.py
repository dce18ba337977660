"""What the report draws, read from the store in one pass: ``RunData`` (numpy columns).

The latencies are those of ``store.latency``, the summary's (completed requests; the ITL gaps
that end inside a kernel-trace window left out, as ``show`` leaves them out); a captured graph
key is *replayed* when a dispatch chose its mode and padded size. For a run with more steps than
``detail_steps`` only a window of steps gets its phase spans loaded (``detail_window``); every
step keeps its overall CPU and GPU span.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from mrv2_prof.analysis.latency import METRICS, latency_values
from mrv2_prof.analysis.spec_metrics import SpecDecodeSummary, spec_decode_summary
from mrv2_prof.store.db import Store, no_run_error

DETAIL_STEPS = 2000  # phase detail on the timeline for at most this many steps
_STEP_COLUMNS = (
    "step", "cpu_start_ns", "cpu_end_ns", "gpu_start_ns", "gpu_end_ns", "num_tokens",
    "graph_mode", "overlap_frac", "host_prep_ns", "hidden_prep_ns", "bubble_ns", "bubble_kind",
    "starved_ns", "perturbed", "num_waiting", "num_running", "kv_used_blocks", "num_preempted",
    "spec_k", "spec_reserved", "spec_reclaimed", "spec_sat_out", "spec_expected_tokens",
    "spec_cost_ratio",
)  # fmt: skip

Columns = dict[str, np.ndarray]


@dataclass
class RunData:
    """One run's tables, reduced to what the figures draw. Times stay int64 perf_counter_ns;
    a NULL integer is NaN (those columns come back as float64)."""

    run_id: str
    label: str
    scenario_name: str
    scenario_yaml: str
    status: str
    device: str
    started_ns: int
    info: dict[str, Any]
    scenario: dict[str, Any]  # the stored scenario YAML, parsed ({} when unreadable)
    steps: Columns
    cpu_spans: Columns  # step, name, start_ns, end_ns: leaf phases inside detail_window
    gpu_spans: Columns  # the same for track 'gpu'
    detail_window: tuple[int, int] | None  # first and last step with phase spans loaded
    syncs: Columns  # kind, site, count, blocked_ns: one row per (kind, site)
    dispatch_reasons: Columns  # mode, reason, count
    captures: Columns  # key, mode, num_tokens, capture_s, mem_bytes, replayed
    staged_by_tensor: Columns  # tensor, writes, staged_bytes, dense_bytes
    staged_by_step: Columns  # step, staged_bytes, dense_bytes
    latencies_ms: dict[str, np.ndarray] = field(default_factory=dict)  # ttft/tpot/itl/e2e, sorted
    gpu_samples: Columns = field(default_factory=dict)
    prefix_hits: Columns = field(default_factory=dict)  # first_token_ns, prompt/cached tokens
    spec: SpecDecodeSummary | None = None  # speculative decoding (None: no drafts verified)

    @property
    def num_steps(self) -> int:
        return len(self.steps["step"])

    @property
    def probes(self) -> dict[str, Any]:
        probes = self.scenario.get("probes")
        return probes if isinstance(probes, dict) else {}

    @property
    def runner(self) -> dict[str, Any]:
        runner = self.scenario.get("runner")
        return runner if isinstance(runner, dict) else {}

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


def _column(values: np.ndarray) -> np.ndarray:
    if not isinstance(values, np.ma.MaskedArray):
        return values
    if values.dtype == object:
        out = values.data.copy()
        out[values.mask] = None
        return out
    return values.astype(np.float64).filled(np.nan)


def _columns(store: Store, sql: str, params: list[Any]) -> Columns:
    """A query's result as numpy columns (NULL numbers become NaN, NULL strings None)."""
    result = store.connection.execute(sql, params).fetchnumpy()
    return {name: _column(values) for name, values in result.items()}


def choose_window(steps: Columns, detail_steps: int) -> tuple[int, int] | None:
    """``detail_steps`` consecutive steps centred on the slowest (longest CPU span) step;
    None when the run has no more steps than that (every step gets its phases)."""
    n = len(steps["step"])
    if n == 0 or n <= detail_steps:
        return None
    slowest = int(np.argmax(steps["cpu_end_ns"] - steps["cpu_start_ns"]))
    lo = min(max(slowest - detail_steps // 2, 0), n - detail_steps)
    return int(steps["step"][lo]), int(steps["step"][lo + detail_steps - 1])


def _spans(store: Store, run_id: str, track: str, window: tuple[int, int] | None) -> Columns:
    where = "run_id = ? AND track = ? AND name NOT IN ('step', 'execute')"
    params: list[Any] = [run_id, track]
    if window is not None:
        where += " AND step BETWEEN ? AND ?"
        params += list(window)
    return _columns(
        store, f"SELECT step, name, start_ns, end_ns FROM spans WHERE {where} ORDER BY start_ns",
        params,
    )  # fmt: skip


def _replayed_keys(store: Store, run_id: str, info: dict[str, Any]) -> set[tuple[str, int]]:
    """(mode, size) of every captured key a step replayed; a list in ``info`` wins."""
    listed = info.get("graph_keys_replayed")
    if isinstance(listed, list):
        pairs = (str(k).split(":", 1) for k in listed)
        return {(mode, int(size)) for mode, size in pairs}
    rows = store.connection.execute(
        "SELECT DISTINCT mode, padded_tokens FROM graph_dispatch "
        "WHERE run_id = ? AND hit AND mode <> 'none'",
        [run_id],
    ).fetchall()
    return {(mode, int(size)) for mode, size in rows}


def _latencies(store: Store, run_id: str) -> dict[str, np.ndarray]:
    """TTFT, TPOT, ITL and E2E by the definitions of ``store.latency``, as the summary has them
    (the ITL gaps that end inside the perturbed window left out)."""
    return {
        name: np.asarray(latency_values(store.connection, run_id, name), dtype=np.float64)
        for name in METRICS
    }


def load_run_data(
    store: Store,
    run_id: str,
    *,
    detail_steps: int = DETAIL_STEPS,
    detail_window: tuple[int, int] | None = None,
) -> RunData:
    """Everything the single-run report draws for ``run_id`` (an exact id)."""
    row = store.connection.execute(
        "SELECT label, scenario_name, scenario_yaml, status, device, started_ns, info "
        "FROM runs WHERE run_id = ?",
        [run_id],
    ).fetchone()
    if row is None:
        raise no_run_error(store.path, run_id)
    label, scenario_name, scenario_yaml, status, device, started_ns, info_json = row
    info = json.loads(info_json) if info_json else {}
    try:
        scenario = yaml.safe_load(scenario_yaml or "")
    except yaml.YAMLError:
        scenario = None

    def q(sql: str) -> Columns:
        return _columns(store, sql, [run_id])

    steps = q(f"SELECT {', '.join(_STEP_COLUMNS)} FROM steps WHERE run_id = ? ORDER BY step")
    window = detail_window if detail_window is not None else choose_window(steps, detail_steps)
    captures = q(
        "SELECT key, mode, num_tokens, capture_s, mem_bytes, coalesce(step, -1) AS step "
        "FROM graph_captures "
        "WHERE run_id = ? ORDER BY mode, num_tokens"
    )
    replayed = _replayed_keys(store, run_id, info)
    captures["replayed"] = np.array(
        [
            (m, int(n)) in replayed
            for m, n in zip(captures["mode"], captures["num_tokens"], strict=True)
        ],
        dtype=bool,
    )
    return RunData(
        run_id=run_id,
        label=label or run_id,
        scenario_name=scenario_name or "",
        scenario_yaml=scenario_yaml or "",
        status=status,
        device=device or "?",
        started_ns=int(started_ns) if started_ns is not None else 0,
        info=info,
        scenario=scenario if isinstance(scenario, dict) else {},
        steps=steps,
        cpu_spans=_spans(store, run_id, "cpu", window),
        gpu_spans=_spans(store, run_id, "gpu", window),
        detail_window=window,
        syncs=q(
            "SELECT kind, site, count(*) AS count, coalesce(sum(blocked_ns), 0) AS blocked_ns "
            "FROM syncs WHERE run_id = ? GROUP BY kind, site ORDER BY count DESC, kind, site"
        ),
        dispatch_reasons=q(
            "SELECT mode, reason, count(*) AS count FROM graph_dispatch WHERE run_id = ? "
            "GROUP BY mode, reason ORDER BY count DESC, mode, reason"
        ),
        captures=captures,
        staged_by_tensor=q(
            "SELECT tensor, count(*) AS writes, sum(staged_bytes) AS staged_bytes, "
            "sum(dense_bytes) AS dense_bytes FROM staged_writes WHERE run_id = ? "
            "GROUP BY tensor ORDER BY tensor"
        ),
        staged_by_step=q(
            "SELECT step, sum(staged_bytes) AS staged_bytes, sum(dense_bytes) AS dense_bytes "
            "FROM staged_writes WHERE run_id = ? GROUP BY step ORDER BY step"
        ),
        latencies_ms=_latencies(store, run_id),
        gpu_samples=q(
            "SELECT t_ns, gpu_util, mem_used_bytes, power_w, sm_clock_mhz FROM gpu_samples "
            "WHERE run_id = ? ORDER BY t_ns"
        ),
        prefix_hits=q(
            "SELECT first_token_ns, prompt_tokens, coalesce(cached_tokens, 0) AS cached_tokens "
            "FROM requests WHERE run_id = ? AND first_token_ns IS NOT NULL "
            "ORDER BY first_token_ns, req_id"
        ),
        spec=spec_decode_summary(store, run_id),
    )
