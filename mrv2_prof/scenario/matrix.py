"""Matrix sweeps: a scenario's ``matrix`` (dotted key -> values) as one scenario per
combination, each validated as if written out."""

from __future__ import annotations

import itertools
import json
from typing import Any

from mrv2_prof.scenario.keys import set_path
from mrv2_prof.scenario.schema import Scenario


def _fmt(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def expand_matrix(scenario: Scenario) -> list[tuple[str, Scenario]]:
    """One ``(label, scenario)`` per combination of the matrix, in key order."""
    if not scenario.matrix:
        return [(scenario.name, scenario)]
    keys = list(scenario.matrix)
    base = scenario.model_dump(exclude={"matrix"})
    if scenario.model.preset_by_default:  # a matrix model.path replaces no preset of the user's
        base["model"]["preset"] = None
    out = []
    for combo in itertools.product(*(scenario.matrix[k] for k in keys)):
        data = json.loads(json.dumps(base, default=str))
        for key, value in zip(keys, combo, strict=True):
            set_path(data, key, value)
        label = ",".join(f"{k}={_fmt(v)}" for k, v in zip(keys, combo, strict=True))
        combo_scenario = Scenario.from_data(data, scenario.source, notes=scenario.notes)
        out.append((f"{scenario.name}[{label}]", combo_scenario))
    return out
