"""The scenario file (DESIGN §5b): schema, loading, ``--set`` overrides and matrix sweeps.

This module owns the names users type in a scenario YAML. Every section is a frozen pydantic
model that rejects unknown keys; every problem is reported as a one-line ``ScenarioError`` of
the form ``<file>: <dotted.field>: <problem>``. The runner keeps its own frozen config
(``RunnerConfig``); ``RunnerSection.to_runner_config`` is the only bridge to it.
"""

from __future__ import annotations

import itertools
import json
import types
import typing
from collections.abc import Iterable
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

if TYPE_CHECKING:
    from mrv2_prof.runner.config import ModelSpec, RunnerConfig


class ScenarioError(ValueError):
    """A scenario that cannot be used; ``str()`` is one line: ``<file>: <field>: <problem>``."""

    def __init__(self, file: str, field: str, problem: str) -> None:
        self.file, self.field = str(file), field
        self.problem = " ".join(str(problem).split())
        where = f"{self.file}: {field}: " if field else f"{self.file}: "
        super().__init__(where + self.problem)


class _FieldError(ValueError):
    """Raised by cross-field checks so the error names the offending sub-field."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(problem)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Section):
    preset: str | None = None
    path: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    seed: int | None = None  # None: the scenario seed

    @model_validator(mode="before")
    @classmethod
    def _default_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is None and data.get("path") is None:
            data = {**data, "preset": "llama-tiny"}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if self.preset is not None and self.path is not None:
            raise _FieldError("path", "give exactly one of 'preset' or 'path'")
        return self

    def to_model_spec(self, seed: int) -> ModelSpec:
        from mrv2_prof.runner.config import ModelSpec

        s = self.seed if self.seed is not None else seed
        return ModelSpec(preset=self.preset, path=self.path, dtype=self.dtype, seed=s)


PosInt = Annotated[int, Field(ge=1)]


class RunnerSection(_Section):
    device: Literal["auto", "cuda", "cpu"] = "auto"
    max_num_reqs: PosInt = 1024
    max_num_seqs: PosInt = 256
    max_num_batched_tokens: PosInt = 8192
    max_model_len: Annotated[int, Field(ge=2)] = 4096
    block_size: PosInt = 16
    num_kv_blocks: int | Literal["auto"] = "auto"
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.8
    enable_prefix_caching: bool = True
    kernels: Literal["triton", "torch"] = "triton"
    async_scheduling: bool = True
    staged_writes: bool = True
    uva: bool = True
    cudagraph_mode: Literal["full", "piecewise", "full_and_piecewise", "none"] = (
        "full_and_piecewise"
    )
    cudagraph_capture_sizes: list[int] | Literal["auto"] = "auto"
    strict: bool = False

    @field_validator("num_kv_blocks", "cudagraph_capture_sizes", mode="before")
    @classmethod
    def _auto_or_positive(cls, v: Any, info: ValidationInfo) -> Any:
        is_list = info.field_name == "cudagraph_capture_sizes"
        items = v if is_list and isinstance(v, list) else [v]
        ok = isinstance(v, list) == is_list and all(type(x) is int and x >= 1 for x in items)
        if v != "auto" and not ok:
            want = "a list of positive integers" if is_list else "an integer >= 1"
            raise ValueError(f"must be 'auto' or {want}, got {v!r}")
        return v

    @model_validator(mode="after")
    def _cross(self) -> RunnerSection:
        if self.max_num_seqs > self.max_num_reqs:
            raise _FieldError(
                "max_num_seqs",
                f"{self.max_num_seqs} exceeds max_num_reqs {self.max_num_reqs}",
            )
        if isinstance(self.cudagraph_capture_sizes, list):
            for size in self.cudagraph_capture_sizes:
                if size > self.max_num_batched_tokens:
                    raise _FieldError(
                        "cudagraph_capture_sizes",
                        f"size {size} exceeds max_num_batched_tokens {self.max_num_batched_tokens}",
                    )
        return self

    def to_runner_config(self, seed: int) -> RunnerConfig:
        """The runner's own config (``auto`` values become None)."""
        from mrv2_prof.runner.config import RunnerConfig

        names = {f.name for f in dataclass_fields(RunnerConfig)}
        kwargs = {k: v for k, v in self.model_dump().items() if k in names}
        if kwargs.get("num_kv_blocks") == "auto":
            kwargs["num_kv_blocks"] = None
        sizes = kwargs.get("cudagraph_capture_sizes")
        kwargs["cudagraph_capture_sizes"] = None if sizes == "auto" else tuple(sizes)
        return RunnerConfig(**kwargs, seed=seed)


class Arrival(_Section):
    pattern: Literal["burst", "constant", "poisson"] = "burst"
    rate: Annotated[float, Field(gt=0)] | None = None  # requests/s

    @model_validator(mode="after")
    def _rate(self) -> Arrival:
        if self.pattern != "burst" and self.rate is None:
            raise _FieldError("rate", f"required for pattern '{self.pattern}'")
        return self


class _Bounded(_Section):
    min: PosInt = 1
    max: PosInt | None = None

    @model_validator(mode="after")
    def _order(self) -> _Bounded:
        if self.max is not None and self.min > self.max:
            raise _FieldError("min", f"{self.min} is greater than max {self.max}")
        return self


class FixedLen(_Section):
    dist: Literal["fixed"]
    value: PosInt


class UniformLen(_Bounded):
    dist: Literal["uniform"]
    min: PosInt
    max: PosInt


class NormalLen(_Bounded):
    dist: Literal["normal"]
    mean: Annotated[float, Field(gt=0)]
    std: Annotated[float, Field(ge=0)]


class LognormalLen(_Bounded):
    """``mean`` is the mean length; ``sigma`` the standard deviation in log space."""

    dist: Literal["lognormal"]
    mean: Annotated[float, Field(gt=0)]
    sigma: Annotated[float, Field(ge=0)]


LengthDist = Annotated[
    Union[FixedLen, UniformLen, NormalLen, LognormalLen],  # noqa: UP007
    Field(discriminator="dist"),
]
_DIST_TAGS = {"fixed", "uniform", "normal", "lognormal"}


class Sampling(_Section):
    temperature: Annotated[float, Field(ge=0)] = 0.0
    top_k: Annotated[int, Field(ge=0)] = 0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    logprobs: Annotated[int, Field(ge=0)] = 0
    prompt_logprobs: Annotated[int, Field(ge=0)] | None = None
    seed: int | None = None


class SharedPrefix(_Section):
    groups: PosInt = 1
    len: Annotated[int, Field(ge=0)] = 0


class WorkloadSection(_Section):
    """Synthetic traffic, or a ``trace`` file (JSONL, resolved against the scenario's directory).

    ``num_requests`` unset means 16 synthetic requests, or every line of a trace. When ``trace``
    is set, the synthetic keys (arrival, lengths, shared_prefix, abort_fraction) are ignored.
    """

    num_requests: PosInt | None = None
    arrival: Arrival = Arrival()
    prompt_len: LengthDist = UniformLen(dist="uniform", min=16, max=96)
    output_len: LengthDist = FixedLen(dist="fixed", value=32)
    sampling: Sampling = Sampling()
    shared_prefix: SharedPrefix | None = None
    abort_fraction: Annotated[float, Field(ge=0, le=1)] = 0.0
    ignore_eos: bool = True
    as_fast_as_possible: bool = False
    trace: Path | None = None

    @field_validator("trace")
    @classmethod
    def _trace_exists(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        if v is None:
            return v
        base = (info.context or {}).get("base_dir")
        if not v.is_absolute() and base is not None:
            v = Path(base) / v
        if not v.is_file():
            raise ValueError(f"trace file not found: {v}")
        return v


class ProbesSection(_Section):
    # On by default: cheap enough to leave on (benchmarks/probe_overhead_runs.py). The sync
    # finder and the copy audit are diagnostics: asked for when looking for a hidden sync.
    nvtx: bool = True
    cuda_events: bool = True
    sync_finder: bool = False
    copy_audit: bool = False
    nvml_hz: Annotated[float, Field(ge=0)] = 10
    kernel_trace: bool = False
    # [first step, number of steps] the kernel trace covers
    kernel_trace_steps: tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=1)]] = (10, 20)


class StoreSection(_Section):
    db: str = "runs.duckdb"


class Scenario(_Section):
    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
    seed: int = 0
    model: ModelSection = ModelSection()
    runner: RunnerSection = RunnerSection()
    workload: WorkloadSection = WorkloadSection()
    probes: ProbesSection = ProbesSection()
    store: StoreSection = StoreSection()
    matrix: dict[str, list[Any]] | None = None
    _source: str = PrivateAttr(default="<scenario>")

    @field_validator("matrix")
    @classmethod
    def _matrix_keys(cls, v: dict[str, list[Any]] | None) -> dict[str, list[Any]] | None:
        for key, values in (v or {}).items():
            if key.split(".")[0] == "matrix" or not _schema_has(key):
                raise _FieldError(key, "unknown key")
            if not values:
                raise _FieldError(key, "needs at least one value")
        return v

    @property
    def source(self) -> str:
        """The file the scenario was read from (or ``<quickstart>``); errors name it."""
        return self._source

    def runner_config(self) -> RunnerConfig:
        return self.runner.to_runner_config(self.seed)

    def model_spec(self) -> ModelSpec:
        return self.model.to_model_spec(self.seed)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (Annotated, Union, types.UnionType):
        args = typing.get_args(annotation)
        args = args[:1] if origin is Annotated else args
        return [m for a in args for m in _models_in(a)]
    return []


def _schema_has(dotted: str, model: type[BaseModel] = Scenario) -> bool:
    head, _, rest = dotted.partition(".")
    info = model.model_fields.get(head)
    if info is None:
        return False
    if not rest:
        return True
    return any(_schema_has(rest, m) for m in _models_in(info.annotation))


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value


def _problem(err: dict[str, Any]) -> str:
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<="}
    if kind in bounds:
        bound = ctx.get({">=": "ge", ">": "gt", "<=": "le"}[bounds[kind]])
        return f"must be {bounds[kind]} {bound}, got {got!r}"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required"
    if kind == "union_tag_invalid":
        return f"unknown dist {ctx.get('tag')!r}, expected one of {ctx.get('expected_tags')}"
    if kind == "union_tag_not_found":
        return "missing 'dist' (fixed, uniform, normal, lognormal)"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return f"{err['msg']}, got {got!r}"


def _to_scenario_error(exc: ValidationError, file: str) -> ScenarioError:
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, _FieldError):
        loc.append(cause.field)
    # Discriminated unions add the tag to the location; users never type it.
    loc = [p for i, p in enumerate(loc) if not (p in _DIST_TAGS and i and "len" in loc[i - 1])]
    return ScenarioError(file, ".".join(loc), _problem(err))


def _validate(data: dict[str, Any], file: str, base_dir: Path | None) -> Scenario:
    try:
        scenario = Scenario.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise _to_scenario_error(exc, file) from None
    scenario._source = file
    return scenario


def _parse_yaml(text: str, file: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise ScenarioError(
            file, where, f"YAML syntax error: {getattr(exc, 'problem', exc)}"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(file, "", f"must be a mapping of keys, got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: Iterable[str], file: str) -> None:
    """Apply ``dotted.key=value`` overrides in place; values are parsed as YAML scalars."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ScenarioError(file, key, f"override {item!r} is not of the form key=value")
        if not _schema_has(key):
            raise ScenarioError(file, key, "unknown key (from --set)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ScenarioError(file, key, f"cannot parse override value {raw!r}") from exc
        _set_path(data, key, value)


def load_scenario(path: str | Path, overrides: Iterable[str] = ()) -> Scenario:
    """Read, override and validate a scenario file; every failure is a ``ScenarioError``."""
    file, path = str(path), Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(file, "", f"cannot read scenario file: {exc.strerror or exc}") from None
    data = _parse_yaml(text, file)
    apply_overrides(data, overrides, file)
    return _validate(data, file, path.resolve().parent)


def _fmt(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def expand_matrix(scenario: Scenario) -> list[tuple[str, Scenario]]:
    """One ``(label, scenario)`` per combination of the matrix, in key order."""
    if not scenario.matrix:
        return [(scenario.name, scenario)]
    keys = list(scenario.matrix)
    base = scenario.model_dump(exclude={"matrix"})
    out = []
    for combo in itertools.product(*(scenario.matrix[k] for k in keys)):
        data = json.loads(json.dumps(base, default=str))
        for key, value in zip(keys, combo, strict=True):
            _set_path(data, key, value)
        label = ",".join(f"{k}={_fmt(v)}" for k, v in zip(keys, combo, strict=True))
        out.append((f"{scenario.name}[{label}]", _validate(data, scenario._source, None)))
    return out


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


def load_quickstart() -> Scenario:
    """The embedded CPU-safe default scenario."""
    return _validate(_parse_yaml(QUICKSTART_YAML, "<quickstart>"), "<quickstart>", None)


def scenario_yaml(data: dict[str, Any]) -> str:
    """``data`` (a ``model_dump``) as the YAML stored with the run."""
    return yaml.safe_dump(json.loads(json.dumps(data)), sort_keys=False)
