"""The scenario file's schema: its root ``Scenario`` and the small sections (model, probes,
store); the runner and workload sections have modules of their own.

This package owns the names users type in a scenario YAML. Every section is a frozen pydantic
model that rejects unknown keys; ``runner:`` is derived from the runner's own ``RunnerConfig``
and ``Scenario.runner_config`` is the one bridge to it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from mrv2_prof.runner.config import DTYPE_NAMES, ModelSpec, RunnerConfig
from mrv2_prof.scenario.errors import to_scenario_error
from mrv2_prof.scenario.keys import has_key
from mrv2_prof.scenario.runner_section import RunnerSection
from mrv2_prof.scenario.section import FROM_YAML, FieldError, RunSeed, Section, Seed
from mrv2_prof.scenario.workload_section import WorkloadSection
from mrv2_prof.views.safe_text import plain

MAX_NAME_CHARS = 200  # a label in tables and titles, not a document
MAX_MATRIX_RUNS = 1000


def quoted(value: object) -> str:
    """A preset or a path in a note, whole (a path is at most 4,096 characters), quoted."""
    return plain(repr(value), limit=4200)


class ModelSection(Section):
    preset: Annotated[str, StringConstraints(max_length=100)] | None = None
    path: Annotated[str, StringConstraints(max_length=4096)] | None = None
    dtype: Literal[DTYPE_NAMES] | None = None
    seed: Seed | None = None  # None: the scenario seed

    _replaced_preset: str | None = PrivateAttr(default=None)
    _preset_by_default: bool = PrivateAttr(default=False)

    @model_validator(mode="wrap")
    @classmethod
    def _one_source(cls, data: Any, handler: Any) -> ModelSection:
        """The preset by default (``llama-tiny``); a ``path`` replaces a ``preset`` (your own
        checkpoint over a scenario's preset), which ``notes`` says."""
        replaced, by_default = None, False
        if isinstance(data, dict) and data.get("path") is not None:
            replaced = data.get("preset")
            data = {k: v for k, v in data.items() if k != "preset"}
        elif isinstance(data, dict) and data.get("preset") is None:
            data, by_default = {**data, "preset": "llama-tiny"}, True
        section = handler(data)
        section._preset_by_default = by_default
        if isinstance(replaced, str):
            section._replaced_preset = replaced
        return section

    @property
    def preset_by_default(self) -> bool:
        """Whether the preset is the default one (the scenario named no model)."""
        return self._preset_by_default

    @property
    def notes(self) -> list[str]:
        if self._replaced_preset is None:
            return []
        return [
            f"model.path {quoted(self.path)} replaces the scenario's model.preset "
            f"{quoted(self._replaced_preset)}"
        ]

    def to_model_spec(self, seed: int) -> ModelSpec:
        s = self.seed if self.seed is not None else seed
        return ModelSpec(preset=self.preset, path=self.path, dtype=self.dtype, seed=s)


class ProbesSection(Section):
    # On by default: cheap enough to leave on (benchmarks/probe_overhead_runs.py). The sync
    # finder and the copy audit are diagnostics: asked for when looking for a hidden sync.
    nvtx: bool = True
    cuda_events: bool = True
    sync_finder: bool = False
    copy_audit: bool = False
    nvml_hz: Annotated[float, Field(ge=0)] = 10
    # HBM read bandwidth of the roofline, GB/s: 0 measures it once per GPU (then cached in the
    # database by GPU UUID); a number gives it and skips the measurement (probes/machine_peaks.py)
    hbm_gbps: Annotated[float, Field(ge=0, le=1_000_000)] = 0
    # The host sampler: the runner's Python stack this many times a second (0: off, no thread)
    host_sampling_hz: Annotated[float, Field(ge=0, le=10_000)] = 0
    kernel_trace: bool = False
    # [first step, number of steps] the kernel trace covers
    kernel_trace_steps: Annotated[
        tuple[Annotated[int, Field(ge=0, strict=True)], Annotated[int, Field(ge=1, strict=True)]],
        FROM_YAML,
    ] = (10, 20)
    # [first step, number of steps] of the allocator's memory history (probes/memory_history.py)
    memory_history: (
        Annotated[
            tuple[
                Annotated[int, Field(ge=0, strict=True)], Annotated[int, Field(ge=1, strict=True)]
            ],
            FROM_YAML,
        ]
        | None
    ) = None


class StoreSection(Section):
    db: Annotated[str, StringConstraints(min_length=1, max_length=4096)] = "runs.duckdb"


class Scenario(Section):
    name: Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_NAME_CHARS)
    ]
    seed: RunSeed = 0
    model: ModelSection = ModelSection()
    runner: RunnerSection = RunnerSection()
    workload: WorkloadSection = WorkloadSection()
    probes: ProbesSection = ProbesSection()
    store: StoreSection = StoreSection()
    matrix: dict[str, list[Any]] | None = None
    # Each matrix combination runs this many times, interleaved (A B A B), one group each
    repeats: Annotated[int, Field(ge=1, le=MAX_MATRIX_RUNS)] = 1
    _source: str = PrivateAttr(default="<scenario>")
    _notes: tuple[str, ...] = PrivateAttr(default=())

    @field_validator("matrix")
    @classmethod
    def _matrix_keys(cls, v: dict[str, list[Any]] | None) -> dict[str, list[Any]] | None:
        for key, values in (v or {}).items():
            if key.split(".")[0] == "matrix" or not has_key(cls, key):
                raise FieldError(key, "unknown key")
            if key == "repeats":
                raise FieldError(key, "not a matrix key: repeats apply to every combination")
            if key.split(".")[0] == "store":
                raise FieldError(
                    key,
                    "not a matrix key: every combination is stored in the one run database "
                    "(store.db or --db); run each database as a scenario of its own",
                )
            if not values:
                raise FieldError(key, "needs at least one value")
        runs = math.prod(len(values) for values in (v or {}).values())
        if runs > MAX_MATRIX_RUNS:
            sizes = " x ".join(str(len(values)) for values in (v or {}).values())
            raise ValueError(
                f"{sizes} = {runs:,} combinations, over the limit of {MAX_MATRIX_RUNS:,} "
                "(each combination is one run)"
            )
        return v

    @classmethod
    def from_data(
        cls,
        data: dict[str, Any],
        file: str,
        base_dir: Path | None = None,
        notes: Iterable[str] = (),
    ) -> Scenario:
        """``data`` validated as the scenario of ``file``, every problem a ``ScenarioError``;
        a trace path is resolved against ``base_dir`` (the scenario file's directory);
        ``notes``: what loading replaced (``--set``), kept with the scenario's own."""
        try:
            scenario = cls.model_validate(data, context={"base_dir": base_dir})
        except ValidationError as exc:
            raise to_scenario_error(exc, file, cls) from None
        scenario._source = file
        scenario._notes = tuple(dict.fromkeys([*notes, *scenario.model.notes]))
        return scenario

    @property
    def notes(self) -> tuple[str, ...]:
        """What the scenario as given had replaced (a preset by ``model.path``): a note on the
        run each."""
        return self._notes

    @property
    def source(self) -> str:
        """The file the scenario was read from (or ``<quickstart>``); errors name it."""
        return self._source

    def runner_config(self) -> RunnerConfig:
        """The runner's config, with the workload's bounds (``WorkloadSection.step_bounds``)
        that its auto CUDA graph capture sizes are cut to."""
        reqs, tokens = self.workload.step_bounds()
        config = self.runner.to_runner_config(self.seed)
        return dataclasses.replace(config, workload_max_reqs=reqs, workload_max_step_tokens=tokens)

    def model_spec(self) -> ModelSpec:
        return self.model.to_model_spec(self.seed)
