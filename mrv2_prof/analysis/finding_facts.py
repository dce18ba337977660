"""The per-run figures the findings read beyond ``run_summary``, computed in SQL.

``finding_facts`` returns plain numbers (``FindingFacts``); the rules that turn them into
findings are pure functions elsewhere (``mrv2_prof.analysis.findings``). The definitions follow
``store.metrics``: perturbed steps (a kernel-trace window) are left out of every step figure
unless ``include_perturbed``; a step is *host-bound* when the device waited for the host before
it (``bubble_kind = 'host_bound'``) or inside it (``starved_ns > 0``).

Speculative decoding's step classes (``SpecStepFacts``), decode-only steps (no prefill tokens)
each, timed by their host span (``cpu_end_ns - cpu_start_ns``: the wall time a step costs, what
dynamic k times too): a *verify step* has ``spec_k > 0`` and read verifies (``spec_verifies``
rows of the step); a *plain decode step* read none and scheduled no draft slots (``spec_k = 0``
or no ``spec_reserved``, else no ``num_draft_tokens`` on a run stored before version 7).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from mrv2_prof.analysis.compiles import LateCompiles, late_compiles
from mrv2_prof.analysis.kernel_roofline import KernelRoofline, kernel_roofline
from mrv2_prof.store.db import Store

# CPU phases that are host work (the containers and the wait for the device are not)
HOST_PHASES = ("schedule", "prepare", "forward", "sample", "update")


@dataclass(frozen=True)
class SpecStepFacts:
    """Speculative decoding's per-step figures the findings read (module doc: the classes)."""

    verify_steps: int = 0
    tokens_per_verify: float | None = None  # mean emitted tokens (1 + accepted) per verify
    verify_step_ms: float | None = None  # mean host span of a verify step
    plain_steps: int = 0
    plain_step_ms: float | None = None  # mean host span of a plain decode step
    # dynamic k's decisions over the steps with spec_k > 0 and both values recorded
    decided_steps: int = 0
    mean_expected_tokens: float | None = None
    mean_cost_ratio: float | None = None
    sat_out_steps: int = 0  # steps with spec_sat_out > 0
    sat_out_requests: int = 0  # sum of spec_sat_out


@dataclass(frozen=True)
class FindingFacts:
    considered_steps: int = 0  # steps the step figures count (perturbed left out by default)
    timed_steps: int = 0  # of them, steps with a GPU timeline (bubble_ns not NULL)
    host_bound_steps: int = 0  # of the timed steps, those where the device waited for the host
    host_phase_ms: dict[str, float] = field(default_factory=dict)  # over the host-bound steps
    implicit_sites: list[tuple[str, int]] = field(default_factory=list)  # site, count; most first
    captured_modes: tuple[str, ...] = ()  # modes with at least one captured graph
    dispatches: list[tuple[str, str, int]] = field(default_factory=list)  # mode, reason, steps
    first_preemption_step: int | None = None
    peak_kv_blocks: int | None = None  # highest kv_used_blocks of a step
    peak_kv_step: int | None = None  # the first step that reached it
    peak_waiting: int | None = None  # most requests waiting in one step
    staged_by_tensor: list[tuple[str, int, int]] = field(
        default_factory=list
    )  # name, staged, dense
    scenario_given: dict[str, Any] = field(default_factory=dict)  # as given (file + --set)
    scenario_as_run: dict[str, Any] = field(default_factory=dict)  # after every downgrade
    spec: SpecStepFacts = field(default_factory=SpecStepFacts)
    late_compiles: LateCompiles = field(default_factory=LateCompiles)  # after warm-up
    kernel_roofline: KernelRoofline | None = None  # per op, the kernel-trace window's


def _yaml(text: str | None) -> dict[str, Any]:
    try:
        value = yaml.safe_load(text or "")
    except yaml.YAMLError:
        return {}
    return value if isinstance(value, dict) else {}


def finding_facts(store: Store, run_id: str, include_perturbed: bool = False) -> FindingFacts:
    """The facts of run ``run_id`` (an exact id) the findings rules take."""
    con = store.connection
    keep = "true" if include_perturbed else "NOT coalesce(perturbed, false)"
    host_bound = "(bubble_kind = 'host_bound' OR coalesce(starved_ns, 0) > 0)"
    considered, timed, bound = con.execute(
        f"SELECT count(*), count(bubble_ns), count(*) FILTER (WHERE bubble_ns IS NOT NULL "
        f"AND {host_bound}) FROM steps WHERE run_id = ? AND {keep}",
        [run_id],
    ).fetchone()
    phases = ", ".join(f"'{p}'" for p in HOST_PHASES)
    host_phase_ms = dict(
        con.execute(
            f"SELECT name, sum(end_ns - start_ns) / 1e6 FROM spans WHERE run_id = ? "
            f"AND track = 'cpu' AND name IN ({phases}) AND step IN (SELECT step FROM steps "
            f"WHERE run_id = ? AND {keep} AND bubble_ns IS NOT NULL AND {host_bound}) "
            "GROUP BY name ORDER BY 2 DESC, name",
            [run_id, run_id],
        ).fetchall()
    )
    implicit = con.execute(
        "SELECT site, count(*) FROM syncs WHERE run_id = ? AND kind = 'implicit' AND (step IS "
        f"NULL OR step NOT IN (SELECT step FROM steps WHERE run_id = ? AND NOT ({keep}))) "
        "GROUP BY site ORDER BY 2 DESC, site",
        [run_id, run_id],
    ).fetchall()
    captured = con.execute(
        "SELECT DISTINCT mode FROM graph_captures WHERE run_id = ? ORDER BY mode", [run_id]
    ).fetchall()
    dispatches = con.execute(
        "SELECT mode, reason, count(*) FROM graph_dispatch WHERE run_id = ? "
        "GROUP BY mode, reason ORDER BY 3 DESC, mode, reason",
        [run_id],
    ).fetchall()
    first_preemption, peak_kv, peak_waiting = con.execute(
        "SELECT min(step) FILTER (WHERE num_preempted > 0), max(kv_used_blocks), "
        "max(num_waiting) FROM steps WHERE run_id = ?",
        [run_id],
    ).fetchone()
    peak_kv_step = None
    if peak_kv is not None:
        (peak_kv_step,) = con.execute(
            "SELECT min(step) FROM steps WHERE run_id = ? AND kv_used_blocks = ?",
            [run_id, peak_kv],
        ).fetchone()
    staged = con.execute(
        "SELECT tensor, sum(staged_bytes)::BIGINT, sum(dense_bytes)::BIGINT FROM staged_writes "
        "WHERE run_id = ? GROUP BY tensor ORDER BY tensor",
        [run_id],
    ).fetchall()
    given, as_run = con.execute(
        "SELECT scenario_given_yaml, scenario_yaml FROM runs WHERE run_id = ?", [run_id]
    ).fetchone() or (None, None)
    return FindingFacts(
        considered_steps=int(considered),
        timed_steps=int(timed),
        host_bound_steps=int(bound),
        host_phase_ms={str(k): float(v) for k, v in host_phase_ms.items()},
        implicit_sites=[(str(site or "?"), int(n)) for site, n in implicit],
        captured_modes=tuple(str(m) for (m,) in captured),
        dispatches=[(str(m), str(r or ""), int(n)) for m, r, n in dispatches],
        first_preemption_step=None if first_preemption is None else int(first_preemption),
        peak_kv_blocks=None if peak_kv is None else int(peak_kv),
        peak_kv_step=None if peak_kv_step is None else int(peak_kv_step),
        peak_waiting=None if peak_waiting is None else int(peak_waiting),
        staged_by_tensor=[(str(t), int(a), int(b)) for t, a, b in staged],
        scenario_given=_yaml(given),
        scenario_as_run=_yaml(as_run),
        spec=spec_step_facts(store, run_id, keep),
        late_compiles=late_compiles(store, run_id),
        kernel_roofline=kernel_roofline(store, run_id),
    )


def spec_step_facts(store: Store, run_id: str, keep: str) -> SpecStepFacts:
    """``SpecStepFacts`` of the steps ``keep`` (an SQL condition on ``steps``) lets through."""
    con = store.connection
    decode_only = f"s.run_id = ? AND {keep} AND coalesce(s.num_prefill_tokens, 0) = 0"
    verifies = (
        "SELECT step, count(*) AS n, sum(1 + num_accepted_tokens) AS emitted "
        "FROM spec_verifies WHERE run_id = ? GROUP BY step"
    )
    span_ms = "(s.cpu_end_ns - s.cpu_start_ns) / 1e6"
    verify_steps, emitted, num_verifies, verify_ms = con.execute(
        f"SELECT count(*), sum(v.emitted), sum(v.n), avg({span_ms}) FROM steps s "
        f"JOIN ({verifies}) v ON v.step = s.step WHERE {decode_only} AND s.spec_k > 0",
        [run_id, run_id],
    ).fetchone()
    plain_steps, plain_ms = con.execute(
        f"SELECT count(*), avg({span_ms}) FROM steps s WHERE {decode_only} "
        "AND (coalesce(s.spec_k, 0) = 0 OR coalesce(s.spec_reserved, s.num_draft_tokens, 0) = 0) "
        "AND s.step NOT IN (SELECT step FROM spec_verifies WHERE run_id = ?)",
        [run_id, run_id],
    ).fetchone()
    decided, expected, cost = con.execute(
        "SELECT count(*), avg(spec_expected_tokens), avg(spec_cost_ratio) FROM steps "
        f"WHERE run_id = ? AND {keep} AND spec_k > 0 AND spec_expected_tokens IS NOT NULL "
        "AND spec_cost_ratio IS NOT NULL",
        [run_id],
    ).fetchone()
    sat_out_steps, sat_out = con.execute(
        "SELECT count(*) FILTER (WHERE spec_sat_out > 0), coalesce(sum(spec_sat_out), 0) "
        f"FROM steps WHERE run_id = ? AND {keep}",
        [run_id],
    ).fetchone()
    return SpecStepFacts(
        verify_steps=int(verify_steps),
        tokens_per_verify=float(emitted) / float(num_verifies) if num_verifies else None,
        verify_step_ms=None if verify_ms is None else float(verify_ms),
        plain_steps=int(plain_steps),
        plain_step_ms=None if plain_ms is None else float(plain_ms),
        decided_steps=int(decided),
        mean_expected_tokens=None if expected is None else float(expected),
        mean_cost_ratio=None if cost is None else float(cost),
        sat_out_steps=int(sat_out_steps),
        sat_out_requests=int(sat_out),
    )
