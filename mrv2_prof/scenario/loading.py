"""Reading a scenario: YAML text, ``--set key=value`` overrides, validation into a ``Scenario``
(``Scenario.from_data``), and the embedded CPU-safe quickstart."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from mrv2_prof.inputs import limited_yaml
from mrv2_prof.inputs.input_file import InputError, MiB, read_text
from mrv2_prof.scenario.errors import ScenarioError
from mrv2_prof.scenario.keys import did_you_mean, has_key, set_path
from mrv2_prof.scenario.schema import Scenario, quoted
from mrv2_prof.views.safe_text import shown

MAX_SCENARIO_BYTES = MiB  # a scenario is a page of YAML; a bigger file is a mistake
MAX_OVERRIDE_CHARS = 4096


def _yaml(text: str, file: str, field: str = "") -> Any:
    try:
        return limited_yaml.load(text)
    except limited_yaml.YamlError as exc:
        where = field or (f"line {exc.line}" if exc.line is not None else "")
        raise ScenarioError(file, where, exc.problem) from None


def parse_yaml(text: str, file: str) -> dict[str, Any]:
    data = _yaml(text, file)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(file, "", f"must be a mapping of keys, got {type(data).__name__}")
    return data


def apply_overrides(
    data: dict[str, Any], overrides: Iterable[str], file: str, notes: list[str] | None = None
) -> None:
    """Apply ``dotted.key=value`` overrides in place; values are parsed as YAML scalars.
    ``notes`` (when given) gets a line for each scenario value an override replaced beyond its
    own key (``model.preset`` replacing ``model.path``)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if len(item) > MAX_OVERRIDE_CHARS:
            raise ScenarioError(
                file,
                key,
                f"override of {len(item):,} characters, over the limit of {MAX_OVERRIDE_CHARS:,}",
            )
        if not sep or not key:
            raise ScenarioError(file, key, f"override {shown(item)} is not of the form key=value")
        if not has_key(Scenario, key):
            raise ScenarioError(file, key, "unknown key (from --set)" + did_you_mean(Scenario, key))
        value = _yaml(raw, file, key) if raw.strip() else None
        set_path(data, key, value)
        if notes is not None:
            _one_model_source(data, key, value, notes)


def _one_model_source(data: dict[str, Any], key: str, value: Any, notes: list[str]) -> None:
    """A ``--set model.preset=NAME`` replaces the scenario's ``model.path`` (the other way
    round, ``ModelSection`` does it), with a note on the run saying so."""
    model = data.get("model")
    if key != "model.preset" or value is None or not isinstance(model, dict):
        return
    path = model.pop("path", None)
    if path is not None:
        notes.append(
            f"model.preset: {quoted(value)} (from --set) replaces the scenario's model.path "
            f"{quoted(path)}"
        )


def load_scenario(path: str | Path, overrides: Iterable[str] = ()) -> Scenario:
    """Read, override and validate a scenario file; every failure is a ``ScenarioError``."""
    file, path = str(path), Path(path)
    try:
        text = read_text(path, "scenario file", MAX_SCENARIO_BYTES)
    except InputError as exc:
        raise ScenarioError(file, "", exc.problem) from None
    data, notes = parse_yaml(text, file), []
    apply_overrides(data, overrides, file, notes)
    return Scenario.from_data(data, file, path.resolve().parent, notes)


def scenario_yaml(data: dict[str, Any]) -> str:
    """``data`` (a ``model_dump``) as the YAML stored with the run."""
    return yaml.safe_dump(json.loads(json.dumps(data)), sort_keys=False)


QUICKSTART_YAML = """\
name: quickstart
model: {preset: llama-tiny}
runner: {device: auto, kernels: torch, async_scheduling: false, uva: false, cudagraph_mode: none,
         num_kv_blocks: 512, max_model_len: 1024, max_num_batched_tokens: 2048}
workload:
  num_requests: 16
  arrival: {pattern: burst}
  prompt_len: {dist: uniform, min: 16, max: 96}
  output_len: {dist: fixed, value: 32}
  sampling: {temperature: 0.0}   # greedy
# GPU probes off: on a CPU there is no GPU timeline, NVML or CUDA sync to record.
probes: {nvtx: false, cuda_events: false, sync_finder: false, copy_audit: false, nvml_hz: 0}
"""


def load_quickstart(overrides: Iterable[str] = ()) -> Scenario:
    """The embedded CPU-safe default scenario, with ``--set`` overrides as a file takes them."""
    data, notes = parse_yaml(QUICKSTART_YAML, "<quickstart>"), []
    apply_overrides(data, overrides, "<quickstart>", notes)
    return Scenario.from_data(data, "<quickstart>", notes=notes)
