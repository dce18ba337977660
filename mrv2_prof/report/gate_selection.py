"""Which thresholds the gate applies: the defaults, overlaid by what the user gave.

In order: ``DEFAULT_THRESHOLDS`` (none with ``replace_defaults``), then the ``--thresholds`` file,
then the ``--max-regression`` flags; a later one replaces an earlier one's threshold for the same
metric and ``off`` drops it. ``--only METRIC,...`` then keeps those metrics alone, each with its
threshold from that overlay (a metric with none there is bad input). The metrics named in the
file, the flags or ``--only`` are *asked for*: one that a run did not measure fails the gate
(``report.gate.missing_result``); a default one measured in neither run is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mrv2_prof.analysis.gate_metrics import METRICS
from mrv2_prof.report.gate import GateError, Threshold, default_thresholds
from mrv2_prof.views.safe_text import shown


@dataclass(frozen=True)
class Selection:
    thresholds: dict[str, Threshold]  # in force, by metric
    asked: frozenset[str]  # the metrics the user named
    summary: str  # one line: how the set was made


def parse_only(values: Iterable[str]) -> list[str]:
    """``--only`` values: metric names, repeatable or comma-separated."""
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    for name in names:
        if name not in METRICS:
            raise GateError(f"--only {shown(name)}: unknown metric; known: {', '.join(METRICS)}")
    return list(dict.fromkeys(names))


def select(
    given: dict[str, Threshold | None], *, only: list[str], replace_defaults: bool
) -> Selection:
    """The thresholds in force from ``given`` (the file's, then the flags', merged) and the
    switches; raises ``GateError`` when nothing is left to gate or ``--only`` names a metric
    with no threshold."""
    if replace_defaults and not given:
        raise GateError("--replace-defaults: no --thresholds or --max-regression to replace them")
    active: dict[str, Threshold | None] = {} if replace_defaults else dict(default_thresholds())
    active.update(given)
    if only:
        for name in only:
            if active.get(name) is None:
                why = "is off" if name in given else "has no default threshold"
                raise GateError(
                    f"--only {name}: {name} {why}; give one, e.g. --max-regression {name}=5%"
                )
        active = {name: active[name] for name in only}
    thresholds = {name: t for name, t in active.items() if t is not None}
    if not thresholds:
        raise GateError("every threshold is off; nothing to gate")
    asked = frozenset(name for name, t in given.items() if t is not None) | frozenset(only)
    return Selection(thresholds, asked, _summary(given, only, replace_defaults, len(thresholds)))


def _summary(
    given: dict[str, Threshold | None], only: list[str], replace_defaults: bool, n: int
) -> str:
    changed = [f"{name}={t.describe() if t else 'off'}" for name, t in given.items()]
    if only:
        head = f"thresholds: only {', '.join(only)} (--only)"
    elif replace_defaults:
        head = f"thresholds: only the {n} given (--replace-defaults)"
    else:
        head = "thresholds: the defaults (mrv2-prof gate --help)"
        if changed:
            head += ", with " + ", ".join(changed)
    return f"{head}; {n} in force"
