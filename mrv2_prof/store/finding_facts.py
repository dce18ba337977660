"""The per-run figures the findings read beyond ``run_summary``, computed in SQL.

``finding_facts`` returns plain numbers (``FindingFacts``); the rules that turn them into
findings are pure functions elsewhere (``mrv2_prof.findings``). The definitions follow
``store.metrics``: perturbed steps (a kernel-trace window) are left out of every step figure
unless ``include_perturbed``; a step is *host-bound* when the device waited for the host before
it (``bubble_kind = 'host_bound'``) or inside it (``starved_ns > 0``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from mrv2_prof.store.db import Store

# CPU phases that are host work (the containers and the wait for the device are not)
HOST_PHASES = ("schedule", "prepare", "forward", "sample", "update")


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
    )
