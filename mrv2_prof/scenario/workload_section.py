"""The scenario's ``workload:`` section: arrivals, length distributions, sampling, shared
prefixes, aborts, or a JSONL trace instead (``mrv2_prof.workload`` draws the requests)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import Field, ValidationInfo, field_validator, model_validator

from mrv2_prof.scenario.section import FieldError, PosInt, Section


class Arrival(Section):
    pattern: Literal["burst", "constant", "poisson"] = "burst"
    rate: Annotated[float, Field(gt=0)] | None = None  # requests/s

    @model_validator(mode="after")
    def _rate(self) -> Arrival:
        if self.pattern != "burst" and self.rate is None:
            raise FieldError("rate", f"required for pattern '{self.pattern}'")
        return self


class _Bounded(Section):
    min: PosInt = 1
    max: PosInt | None = None

    @model_validator(mode="after")
    def _order(self) -> _Bounded:
        if self.max is not None and self.min > self.max:
            raise FieldError("min", f"{self.min} is greater than max {self.max}")
        return self


class FixedLen(Section):
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
DIST_TAGS = {"fixed", "uniform", "normal", "lognormal"}


class Sampling(Section):
    temperature: Annotated[float, Field(ge=0)] = 0.0
    top_k: Annotated[int, Field(ge=0)] = 0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    logprobs: Annotated[int, Field(ge=0)] = 0
    prompt_logprobs: Annotated[int, Field(ge=0)] | None = None
    seed: int | None = None


class SharedPrefix(Section):
    groups: PosInt = 1
    len: Annotated[int, Field(ge=0)] = 0


class WorkloadSection(Section):
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
