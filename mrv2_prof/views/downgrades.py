"""What a run did not do as asked: the scenario as given against the scenario as run.

``runs.scenario_given_yaml`` holds what was asked (file plus ``--set``), ``runs.scenario_yaml``
what ran after every downgrade (the kernel set, UVA, the CUDA graph mode, probes a CPU run
cannot record). A downgrade is a key of the ``runner``, ``model`` or ``probes`` section whose
value was set (not ``auto``) and differs in the scenario as run. Plain functions over the two
parsed documents, shared by ``show``, the matrix table, the sweep report and the findings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

SECTIONS = ("runner", "model", "probes")
# resolved rather than downgraded: a size list worked out from the model, a block count, a window
_RESOLVED = {"cudagraph_capture_sizes", "num_kv_blocks", "kernel_trace_steps"}


@dataclass(frozen=True)
class Downgrade:
    key: str  # dotted, e.g. runner.kernels
    asked: Any
    ran: Any

    @property
    def short(self) -> str:
        """``kernels triton→torch``: the key without its section, what was asked, what ran."""
        return f"{self.key.rsplit('.', 1)[-1]} {_text(self.asked)}→{_text(self.ran)}"

    @property
    def sentence(self) -> str:
        return f"{self.key}: {_text(self.asked)} asked, {_text(self.ran)} ran"


def matrix_cell(value: Any, key: str, found: list[Downgrade]) -> str:
    """A matrix value as a sweep table shows it: ``triton``, or ``triton (ran torch)`` when the
    run downgraded that key."""
    for d in found:
        if d.key == key:
            return f"{_text(value)} (ran {_text(d.ran)})"
    return _text(value)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def downgrades(given: dict[str, Any], as_run: dict[str, Any]) -> list[Downgrade]:
    """Every key whose value as run differs from the value asked (see the module docstring)."""
    found = []
    for section in SECTIONS:
        asked_section, ran_section = given.get(section), as_run.get(section)
        if not isinstance(asked_section, dict) or not isinstance(ran_section, dict):
            continue
        for key, asked in asked_section.items():
            if key in _RESOLVED or asked is None or asked == "auto" or key not in ran_section:
                continue
            ran = ran_section[key]
            if isinstance(asked, (dict, list)) or ran == asked:
                continue
            found.append(Downgrade(f"{section}.{key}", asked, ran))
    return found


def runner_downgrades(given: dict[str, Any], as_run: dict[str, Any]) -> list[Downgrade]:
    """The downgrades of what the runner ran (``runner`` and ``model``), not of the probes: what
    a sweep row must say it measured."""
    return [d for d in downgrades(given, as_run) if not d.key.startswith("probes.")]


def parse_scenario(text: str | None) -> dict[str, Any]:
    """A stored scenario YAML as a dict ({} when missing or unreadable)."""
    try:
        value = yaml.safe_load(text or "")
    except yaml.YAMLError:
        return {}
    return value if isinstance(value, dict) else {}


def stored_runner_downgrades(given_yaml: str | None, as_run_yaml: str | None) -> list[Downgrade]:
    """``runner_downgrades`` of a run's ``scenario_given_yaml`` and ``scenario_yaml``; none when
    the scenario as given was not stored (an older run)."""
    if not given_yaml:
        return []
    return runner_downgrades(parse_scenario(given_yaml), parse_scenario(as_run_yaml))
