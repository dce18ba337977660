"""The scenario's ``workload:`` section: arrivals, length distributions, sampling, shared
prefixes, aborts, or a JSONL trace or a ShareGPT dataset instead (``mrv2_prof.workload`` draws
the requests)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import Field, ValidationInfo, field_validator, model_validator

from mrv2_prof.inputs.finite_numbers import shown_number
from mrv2_prof.inputs.input_file import InputError, check_regular_file
from mrv2_prof.scenario.section import FROM_YAML, FieldError, PosInt, Section, Seed

DEFAULT_NUM_REQUESTS = 16  # synthetic workloads without num_requests
# Upper bounds, each with the reason it gives when crossed.
MAX_LEN = 10_000_000
LEN_REASON = "lengths are cut to runner.max_model_len, and no model is that long"
MAX_NUM_REQUESTS = 1_000_000
NUM_REQUESTS_REASON = "a workload is built in memory before the run; split a longer one"
MAX_ARRIVAL_S = 86_400.0
ARRIVAL_REASON = "arrivals are honoured in wall time: the run would last more than a day"
MAX_SIGMA = 10.0


def over(limit: float, got: float, reason: str) -> str:
    """The problem of a value above its upper bound, with the bound's reason."""
    return f"must be <= {limit:,}, got {shown_number(got)} ({reason})"


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
        for name in ("min", "max"):
            value = getattr(self, name)
            if value is not None and value > MAX_LEN:
                raise FieldError(name, over(MAX_LEN, value, LEN_REASON))
        if self.max is not None and self.min > self.max:
            raise FieldError("min", f"{self.min} is greater than max {self.max}")
        return self


class FixedLen(Section):
    dist: Literal["fixed"]
    value: PosInt

    @model_validator(mode="after")
    def _bounded(self) -> FixedLen:
        if self.value > MAX_LEN:
            raise FieldError("value", over(MAX_LEN, self.value, LEN_REASON))
        return self


DEFAULT_OUTPUT_LEN = FixedLen(dist="fixed", value=32)  # synthetic traffic without output_len


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

    @model_validator(mode="after")
    def _sigma(self) -> LognormalLen:
        if self.sigma > MAX_SIGMA:
            reason = "exp(10 sigma) already spans over 40 orders of magnitude"
            raise FieldError("sigma", over(MAX_SIGMA, self.sigma, reason))
        return self


def longest(dist: FixedLen | _Bounded) -> int | None:
    """The largest length ``dist`` draws; None for a normal or lognormal without ``max``."""
    return dist.value if isinstance(dist, FixedLen) else dist.max


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
    seed: Seed | None = None
    # Tokens that end a request with finish_reason 'stop' (vLLM's stop_token_ids: they stop it
    # even with ignore_eos); checked against the model's vocabulary before the run.
    stop_token_ids: Annotated[tuple[Annotated[int, Field(ge=0)], ...], FROM_YAML] = ()


def _input_path(v: Path, info: ValidationInfo, what: str) -> Path:
    """``v`` resolved against the scenario's directory; a missing or non-regular file is a
    ValueError naming it."""
    base = (info.context or {}).get("base_dir")
    if not v.is_absolute() and base is not None:
        v = Path(base) / v
    if not v.exists() and not v.is_symlink():
        raise ValueError(f"{what} not found: {v}")
    try:
        check_regular_file(v, what)
    except InputError as exc:
        raise ValueError(str(exc)) from None
    return v


class Dataset(Section):
    """A ShareGPT-format JSON file, as ``vllm bench serve --dataset-name sharegpt`` reads it
    (resolved against the scenario's directory); ``chat``: each prompt is sent as a user message
    through the model's chat template instead of as plain text."""

    path: Annotated[Path, FROM_YAML]
    chat: bool = False

    @field_validator("path")
    @classmethod
    def _path_exists(cls, v: Path, info: ValidationInfo) -> Path:
        return _input_path(v, info, "dataset file")


class SharedPrefix(Section):
    groups: PosInt = 1
    len: Annotated[int, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _bounded(self) -> SharedPrefix:
        if self.len > MAX_LEN:
            raise FieldError("len", over(MAX_LEN, self.len, LEN_REASON))
        if self.groups > MAX_NUM_REQUESTS:
            reason = "a group is used by at least one request, and a run has at most that many"
            raise FieldError("groups", over(MAX_NUM_REQUESTS, self.groups, reason))
        return self


class WorkloadSection(Section):
    """Synthetic traffic, a ``trace`` file (JSONL, resolved against the scenario's directory) or
    a ShareGPT ``dataset``.

    ``num_requests`` unset means 16 synthetic requests, or every line of a trace, or every entry
    of a dataset that passes its length filters. When ``trace`` is set, the synthetic keys
    (arrival, lengths, shared_prefix, abort_fraction) are ignored; a dataset takes ``arrival``,
    ``abort_fraction`` and, when the scenario gives it, ``output_len``. ``ignore_eos`` unset
    means true on a random-weight preset and false on a real model.
    """

    num_requests: PosInt | None = None
    arrival: Arrival = Arrival()
    prompt_len: LengthDist = UniformLen(dist="uniform", min=16, max=96)
    # None: fixed 32 for synthetic traffic; with a dataset, each reply's own length
    output_len: LengthDist | None = None
    sampling: Sampling = Sampling()
    shared_prefix: SharedPrefix | None = None
    # Repetitive prompts: each prompt's own tokens (after any shared prefix) are one random
    # segment of this many tokens, repeated (what an n-gram drafter finds matches in).
    repeated_segment_len: PosInt | None = None
    abort_fraction: Annotated[float, Field(ge=0, le=1)] = 0.0
    ignore_eos: bool | None = None
    as_fast_as_possible: bool = False
    trace: Annotated[Path | None, FROM_YAML] = None
    dataset: Dataset | None = None

    @model_validator(mode="after")
    def _bounded(self) -> WorkloadSection:
        seg = self.repeated_segment_len
        if seg is not None and seg > MAX_LEN:
            raise FieldError("repeated_segment_len", over(MAX_LEN, seg, LEN_REASON))
        n = self.num_requests
        if n is not None and n > MAX_NUM_REQUESTS:
            raise FieldError("num_requests", over(MAX_NUM_REQUESTS, n, NUM_REQUESTS_REASON))
        if self.trace is not None and self.dataset is not None:
            raise FieldError("dataset", "give at most one of 'trace' or 'dataset'")
        rate = self.arrival.rate
        counted = self.dataset is None or n is not None  # a dataset's count: known once read
        if self.trace is None and counted and not self.as_fast_as_possible and rate is not None:
            n = DEFAULT_NUM_REQUESTS if n is None else n
            last_s = (n - 1) / rate  # the last arrival (poisson: its expectation)
            if last_s > MAX_ARRIVAL_S:
                raise FieldError(
                    "arrival.rate",
                    f"{rate:g}/s puts the last of {n:,} arrivals at {last_s:,.0f} s, "
                    f"over the limit of {MAX_ARRIVAL_S:,.0f} s ({ARRIVAL_REASON})",
                )
        return self

    def step_bounds(self) -> tuple[int | None, int | None]:
        """What the runner's auto CUDA graph sizes are bounded by, known before the workload is
        built (None: unknown): the most requests (a trace or dataset without ``num_requests``:
        unknown) and the most tokens one step can schedule, ``num_requests`` x (longest prompt
        + longest output), which also holds a preempted request's recompute (known for
        synthetic lengths with a largest value only: a trace's or dataset's are read later)."""
        n = self.num_requests
        if self.trace is not None or self.dataset is not None:
            return n, None
        n = DEFAULT_NUM_REQUESTS if n is None else n
        prompt, output = longest(self.prompt_len), longest(self.output_len or DEFAULT_OUTPUT_LEN)
        if prompt is None or output is None:
            return n, None
        if self.shared_prefix is not None:  # a prompt is made longer than its shared prefix
            prompt = max(prompt, self.shared_prefix.len + 1)
        return n, n * (prompt + output)

    @field_validator("trace")
    @classmethod
    def _trace_exists(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        return None if v is None else _input_path(v, info, "trace file")
