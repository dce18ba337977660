"""One side of a comparison: a run, or a group of repeats, with what compare and gate need.

A side is what ``--baseline``/``RUN_A`` names (``store.run_refs``: a run, ``group:ID``,
``baseline:NAME``): the gate metrics of each of its runs, its per-request latency samples when
it is one run (``store.samples``), and each run's stored facts (scenario as run, device,
environment, notes, leak counters) for the comparability check and the gate's stages. A metric's
value for a group is the median over its runs.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrv2_prof.analysis.gate_metrics import METRICS, RunMetrics, gate_metrics
from mrv2_prof.analysis.samples import latency_samples
from mrv2_prof.store import Store
from mrv2_prof.store.run_refs import resolve_runs


@dataclass(frozen=True)
class RunFacts:
    """A run's stored facts (``runs`` row) the comparability check and the stages read."""

    run_id: str
    device: str | None
    scenario_yaml: str | None
    environment: dict[str, Any]
    info: dict[str, Any]
    writer_host: str | None

    @property
    def notes(self) -> list[str]:
        notes = self.info.get("notes")
        return [str(n) for n in notes] if isinstance(notes, list) else []


@dataclass(frozen=True)
class Side:
    ref: str
    db: str
    group: str | None  # the run_group the reference named
    runs: list[RunMetrics]
    facts: list[RunFacts]
    samples: dict[str, list[float]] = field(default_factory=dict)  # one run: ttft, tpot, itl

    @property
    def run_ids(self) -> list[str]:
        return [r.run_id for r in self.runs]

    @property
    def single(self) -> bool:
        return len(self.runs) == 1

    def values(self, name: str) -> list[float]:
        """The metric in each run that measured it."""
        return [v for r in self.runs if (v := r.values[name]) is not None]

    def value(self, name: str) -> float | None:
        """The run's value, or the median over the group's runs (None: measured in none)."""
        values = self.values(name)
        return statistics.median(values) if values else None

    def title(self) -> str:
        if self.single:
            return self.runs[0].run_id
        return f"group {self.group or '?'} ({len(self.runs)} runs)"

    def as_run(self) -> RunMetrics:
        """The side as one ``RunMetrics`` (a group's medians), for the tables."""
        first = self.runs[0]
        if self.single:
            return first
        statuses = sorted({r.status for r in self.runs})
        return RunMetrics(
            run_id=self.title(),
            label=first.label,
            status=",".join(statuses),
            error=next((r.error for r in self.runs if r.error), None),
            values={name: self.value(name) for name in METRICS},
            perturbed_steps=sum(r.perturbed_steps for r in self.runs),
            environment=first.environment,
        )


def _json(text: str | None) -> dict[str, Any]:
    data = json.loads(text) if text else {}
    return data if isinstance(data, dict) else {}


def run_facts(store: Store, run_id: str) -> RunFacts:
    row = store.connection.execute(
        "SELECT run_id, device, scenario_yaml, environment, info, writer_host FROM runs "
        "WHERE run_id = ?",
        [run_id],
    ).fetchone()
    return RunFacts(row[0], row[1], row[2], _json(row[3]), _json(row[4]), row[5])


def load_side(store: Store, ref: str) -> Side:
    """The side ``ref`` names in ``store``; raises ``StoreError``."""
    resolved = resolve_runs(store, ref)
    runs = [gate_metrics(store, run_id) for run_id in resolved.run_ids]
    facts = [run_facts(store, run_id) for run_id in resolved.run_ids]
    samples = latency_samples(store, runs[0].run_id) if len(runs) == 1 else {}
    return Side(ref, str(store.path), resolved.group, runs, facts, samples)


def load_sides(db_a: Path, ref_a: str, db_b: Path, ref_b: str) -> tuple[Side, Side]:
    """Both sides (``db_b`` may be ``db_a``); raises ``StoreError``."""
    with Store.open(db_a, read_only=True) as store_a:
        a = load_side(store_a, ref_a)
        if Path(db_b).resolve() == Path(db_a).resolve():
            return a, load_side(store_a, ref_b)
    with Store.open(db_b, read_only=True) as store_b:
        return a, load_side(store_b, ref_b)
