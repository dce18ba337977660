"""The scenario file: the names users type in a scenario YAML, loading, ``--set`` overrides and
matrix sweeps. Every problem is a one-line ``ScenarioError``: ``<file>: <dotted.field>: <problem>``.

``schema`` (the root and the small sections), ``runner_section`` (derived from the runner's
``RunnerConfig``), ``workload_section``, ``keys`` (dotted keys), ``errors``, ``loading`` and
``matrix``; the names below are the package's interface.
"""

from mrv2_prof.scenario.errors import ScenarioError
from mrv2_prof.scenario.loading import (
    QUICKSTART_YAML,
    apply_overrides,
    load_quickstart,
    load_scenario,
    scenario_yaml,
)
from mrv2_prof.scenario.matrix import expand_matrix
from mrv2_prof.scenario.runner_section import RunnerSection
from mrv2_prof.scenario.schema import ModelSection, ProbesSection, Scenario, StoreSection
from mrv2_prof.scenario.workload_section import (
    Arrival,
    FixedLen,
    LengthDist,
    LognormalLen,
    NormalLen,
    Sampling,
    SharedPrefix,
    UniformLen,
    WorkloadSection,
)

__all__ = [
    "QUICKSTART_YAML",
    "Arrival",
    "FixedLen",
    "LengthDist",
    "LognormalLen",
    "ModelSection",
    "NormalLen",
    "ProbesSection",
    "RunnerSection",
    "Sampling",
    "Scenario",
    "ScenarioError",
    "SharedPrefix",
    "StoreSection",
    "UniformLen",
    "WorkloadSection",
    "apply_overrides",
    "expand_matrix",
    "load_quickstart",
    "load_scenario",
    "scenario_yaml",
]
