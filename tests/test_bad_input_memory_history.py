"""``probes.memory_history`` through the real command line: a window that is not two whole
numbers, a negative first step or an empty window is one line naming the field, exit 2, the
database byte for byte as it was (tests/test_bad_input_cli.py's check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrv2_prof.scenario import Scenario
from tests.test_bad_input_cli import OK, RUN, Case, check_case

FIELD = "s.yaml: probes.memory_history"


def _set(value: str, *expect: str) -> Case:
    return Case([*RUN, "--set", f"probes.memory_history={value}"], [FIELD, *expect], {"s.yaml": OK})


CASES: dict[str, Case] = {
    "one-number": _set("[3]", "memory_history.1: required"),
    "three-numbers": _set("[3, 2, 1]", "at most 2"),
    "negative-first": _set("[-1, 2]", "memory_history.0: must be >= 0, got -1"),
    "no-steps": _set("[3, 0]", "memory_history.1: must be >= 1, got 0"),
    "float-steps": _set("[3, 2.5]", "valid integer"),
    "bool-first": _set("[true, 2]", "valid integer"),
    "a-string": _set("'3,2'", "valid tuple"),
    "in-the-file": Case(RUN, [FIELD, "valid tuple"],
                        {"s.yaml": OK + "probes: {memory_history: 5}\n"}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_window_is_one_line_exit_2_and_nothing_written(
    name: str, tmp_path: Path, base_db: Path
) -> None:
    check_case(CASES[name], tmp_path, base_db)


def test_the_window_is_off_by_default_and_a_list_becomes_a_pair():
    assert Scenario.model_validate({"name": "x"}).probes.memory_history is None
    probes = {"memory_history": [0, 4]}
    assert Scenario.model_validate({"name": "x", "probes": probes}).probes.memory_history == (0, 4)
