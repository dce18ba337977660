"""``run --repeats N`` (and ``repeats:`` in a scenario): the order of a matrix's runs.

Each combination runs N times, interleaved across the matrix (A B A B, not A A B B), so a
drift of the machine (clocks, a neighbour's load) falls on every combination alike. The N runs
of one combination form one group (``runs.run_group``, ``repeat_index`` 0..N-1), which compare
and gate take as ``group:ID``; one run of each (N = 1) is no group.
"""

from __future__ import annotations

import secrets

from mrv2_prof.scenario import Scenario, ScenarioError
from mrv2_prof.scenario.schema import MAX_MATRIX_RUNS


def repeated(
    combos: list[tuple[str, Scenario]], times: int, source: str
) -> list[tuple[str, Scenario, str | None, int | None]]:
    """``(label, scenario, group, repeat_index)`` per run, in the order they run."""
    if not isinstance(times, int) or times < 1:
        raise ScenarioError(
            "--repeats", "", f"{times!r}: expected a whole number of runs, 1 or more"
        )
    if times * len(combos) > MAX_MATRIX_RUNS:
        raise ScenarioError(
            source,
            "repeats",
            f"{len(combos)} combinations x {times} repeats = {times * len(combos):,} runs, over "
            f"the limit of {MAX_MATRIX_RUNS:,}",
        )
    if times == 1:
        return [(label, scenario, None, None) for label, scenario in combos]
    token = secrets.token_hex(3)
    groups = [token if len(combos) == 1 else f"{token}-{i}" for i in range(len(combos))]
    return [
        (label, scenario, groups[i], r)
        for r in range(times)
        for i, (label, scenario) in enumerate(combos)
    ]
