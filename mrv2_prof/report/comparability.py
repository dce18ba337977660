"""Can two sides be compared? Their scenario as run, model, device, driver, torch, GPU and host.

Each run's stored facts (``runs.scenario_yaml``, ``device``, ``info``, ``environment``) are set
against the baseline's first run. A *blocking* difference (the scenario as run, the model, the
device, torch or CUDA, the GPU, its driver or maximum clocks, the host's CPU or thread settings)
makes ``gate`` refuse unless ``--allow-different``; the others (the host's name, the GPU's UUID:
another card of the same model, the SM clock at the start, which an idle GPU lowers, and the
other processes on the GPU at the start) are listed and never refuse. Runs of a group spread
over hosts or GPUs are each set against the baseline's first run, so a side that ran elsewhere
is said. A run stored without an environment is not checked there, and says so.

The host's load is set against the baseline's too (``host_contention``: the load beyond the run
at the start and end, the higher of the two over the host's cores): two runs whose load per core
differs by ``LOAD_DIFFERENCE`` (0.25) or more, or either of them on a contended host, are a
non-blocking ``host: load`` difference with both figures. It does not refuse: the load is the
host's state, not the runs' setup, and the thread settings it may have changed (``torch_threads``)
are checked as above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mrv2_prof.analysis.host_contention import LOAD_DIFFERENCE, Contention, assess
from mrv2_prof.analysis.run_sides import RunFacts, Side
from mrv2_prof.inputs import limited_yaml
from mrv2_prof.views.safe_text import shown

# (what, environment key, blocking)
_ENVIRONMENT = (
    ("torch", "torch", True),
    ("torch", "cuda", True),
    ("GPU", "gpu_name", True),
    ("driver", "gpu_driver", True),
    ("GPU clocks", "gpu_max_sm_clock_mhz", True),
    ("GPU clocks", "gpu_max_mem_clock_mhz", True),
    ("GPU clocks", "gpu_sm_clock_mhz", False),
    ("host", "cpu_model", True),
    ("host", "cpu_count", True),
    ("host", "OMP_NUM_THREADS", True),
    ("host", "MKL_NUM_THREADS", True),
    ("host", "torch_threads", True),
    ("host", "torch_interop_threads", True),
)
# checked elsewhere (the device), or no part of what ran (the file, the sweep, how many repeats)
_NOT_SCENARIO = ("store.db", "runner.device", "matrix", "repeats")


@dataclass(frozen=True)
class Difference:
    what: str  # scenario | model | device | torch | GPU | driver | GPU clocks | host
    key: str
    baseline: Any
    candidate: Any
    blocking: bool
    run_id: str  # the run that differs from the baseline's first run

    def describe(self) -> str:
        return (
            f"{self.what}: {self.key} differs ({shown(self.baseline)} vs "
            f"{shown(self.candidate)}, run {self.run_id})"
        )


@dataclass(frozen=True)
class Comparability:
    differences: list[Difference]
    unchecked: list[str]  # what could not be checked, and why

    @property
    def blocking(self) -> list[Difference]:
        return [d for d in self.differences if d.blocking]

    def refusal(self) -> str:
        """The one line ``gate`` ends with when it refuses."""
        shown_ = "; ".join(d.describe() for d in self.blocking[:4])
        more = f"; and {len(self.blocking) - 4} more" if len(self.blocking) > 4 else ""
        return f"the runs are not comparable: {shown_}{more} (--allow-different gates them anyway)"


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        flat.update(_flat(value, name) if isinstance(value, dict) else {name: value})
    return flat


def _scenario(facts: RunFacts) -> dict[str, Any] | None:
    try:
        data = limited_yaml.load(facts.scenario_yaml or "")
    except limited_yaml.YamlError:
        return None
    return _flat(data) if isinstance(data, dict) else {}


def _load(c: Contention) -> str:
    peak, per_core = c.peak_load, c.load_per_core
    if peak is None or per_core is None:
        text = "load not recorded"
    else:
        text = f"load {peak:.2f} beyond the run on {c.cores} cores ({per_core:.2f} per core)"
    return text + (f", contended: {'; '.join(c.reasons)}" if c.contended else "")


def _cotenants(env: dict[str, Any]) -> str | None:
    """The other processes on the run's GPU at its start, counted (None: not recorded)."""
    found = env.get("gpu_cotenants")
    if not isinstance(found, list):
        return None
    return f"{len(found)} other process{'es' if len(found) != 1 else ''}" if found else "none"


def _load_difference(base: RunFacts, other: RunFacts) -> Difference | None:
    """The hosts' load, when it differs materially or either host was contended (module doc)."""
    a, b = assess(base.environment), assess(other.environment)
    if a is None or b is None:
        return None
    pa, pb = a.load_per_core, b.load_per_core
    differs = pa is not None and pb is not None and abs(pa - pb) >= LOAD_DIFFERENCE
    if not (differs or a.contended or b.contended):
        return None
    return Difference("host", "load", _load(a), _load(b), False, other.run_id)


def _threads_chosen_by_load(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Both runners took the default thread count, which follows the host's load
    (``runner_threads``): a different count is the load's doing, reported (with the load) but
    not blocking, so identical configs on a busier host are still compared."""
    return all(
        env.get("torch_threads_set_by") and "(given)" not in env["torch_threads_set_by"]
        for env in (a, b)
    )


def _differences(base: RunFacts, other: RunFacts) -> tuple[list[Difference], list[str]]:
    out: list[Difference] = []
    unchecked: list[str] = []

    def add(what: str, key: str, a: Any, b: Any, blocking: bool = True) -> None:
        if a != b:
            out.append(Difference(what, key, a, b, blocking, other.run_id))

    sa, sb = _scenario(base), _scenario(other)
    if sa is None or sb is None:
        unchecked.append(f"scenario: run {other.run_id}: the stored scenario is not YAML")
    else:
        for key in sorted(set(sa) | set(sb)):
            if key.startswith(_NOT_SCENARIO):
                continue
            what = "model" if key.startswith("model.") else "scenario"
            add(what, key, sa.get(key), sb.get(key))
    for key in ("model_params", "dtype"):
        add("model", key, base.info.get(key), other.info.get(key))
    add("device", "device", base.device, other.device)
    if not base.environment or not other.environment:
        missing = base.run_id if not base.environment else other.run_id
        unchecked.append(f"environment: run {missing} was stored without one (not checked)")
    else:
        chosen = _threads_chosen_by_load(base.environment, other.environment)
        for what, key, blocking in _ENVIRONMENT:
            blocking = blocking and not (key == "torch_threads" and chosen)
            add(what, key, base.environment.get(key), other.environment.get(key), blocking)
        # where it ran (recorded lately: set against a run from before, nothing is said)
        for key, a, b in (
            ("gpu_uuid", base.environment.get("gpu_uuid"), other.environment.get("gpu_uuid")),
            ("co-tenants", _cotenants(base.environment), _cotenants(other.environment)),
        ):
            if a is not None and b is not None:
                add("GPU", key, a, b, blocking=False)
        load = _load_difference(base, other)
        if load is not None:
            out.append(load)
    add("host", "writer_host", base.writer_host, other.writer_host, blocking=False)
    return out, unchecked


def check(baseline: Side, candidate: Side) -> Comparability:
    """Every run of both sides against the baseline's first run."""
    first = baseline.facts[0]
    seen: set[tuple] = set()
    differences: list[Difference] = []
    unchecked: list[str] = []
    for facts in [*baseline.facts[1:], *candidate.facts]:
        found, missing = _differences(first, facts)
        for d in found:
            key = (d.what, d.key, repr(d.baseline), repr(d.candidate))
            if key not in seen:
                seen.add(key)
                differences.append(d)
        unchecked.extend(m for m in missing if m not in unchecked)
    return Comparability(differences, unchecked)
