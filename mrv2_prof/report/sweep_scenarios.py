"""Whether the runs on one comparison page ran the same scenario: a sweep's runs differ only in
their matrix values; runs picked by hand (``report A B C``) may differ in anything. The page is
titled by what it compares, and says which keys differ when the scenarios do.

Compared: each run's scenario as given (``runs.scenario_given_yaml``: the file and ``--set``;
the scenario as run for a run stored without it), flattened to dotted keys; ignored: every
run's matrix keys, ``matrix`` itself, ``repeats`` and ``store.db`` (where the run was stored
changes nothing it measured).
"""

from __future__ import annotations

from typing import Any

import yaml

from mrv2_prof.report.sweep import Headline

_IGNORED = ("matrix", "repeats", "store.db")
MAX_KEYS_SHOWN = 8


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def _given(run: Headline) -> dict[str, Any] | None:
    try:
        data = yaml.safe_load(run.given_yaml) if run.given_yaml else None
    except yaml.YAMLError:
        return None
    return _flat(data) if isinstance(data, dict) else None


def differing_keys(runs: list[Headline]) -> list[str] | None:
    """The dotted keys (beyond the matrix's) whose values differ between ``runs``, sorted; None
    when a run's scenario was not stored (it cannot be told)."""
    flats = [_given(r) for r in runs]
    if any(f is None for f in flats):
        return None
    matrix = {k for r in runs for k in r.combo}

    def ignored(key: str) -> bool:
        return key in matrix or any(key == i or key.startswith(i + ".") for i in _IGNORED)

    keys = sorted({k for f in flats for k in f if not ignored(k)})
    missing = object()
    return [k for k in keys if len({repr(f.get(k, missing)) for f in flats}) > 1]


def page_heading(runs: list[Headline]) -> tuple[str, str]:
    """``(title, note)``: ``sweep report`` over runs of one scenario (a note "" then), else a
    comparison of different scenarios and a note naming the keys that differ."""
    differ = differing_keys(runs)
    if differ == []:
        return f"sweep report: {len(runs)} runs", ""
    if differ is None:
        return (
            f"comparison report: {len(runs)} runs",
            "a run's scenario was not stored: whether the runs ran the same scenario cannot "
            "be told",
        )
    shown = ", ".join(differ[:MAX_KEYS_SHOWN])
    more = f" and {len(differ) - MAX_KEYS_SHOWN} more" if len(differ) > MAX_KEYS_SHOWN else ""
    return (
        f"comparison report: {len(runs)} runs of different scenarios",
        f"the runs' scenarios differ (as given, beyond any matrix values) in {shown}{more}: "
        "the figures compare different setups, not one change",
    )
