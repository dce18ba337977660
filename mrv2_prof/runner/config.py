"""The runner's configuration, validated once and frozen; start-up values live in ``RuntimeInfo``.

``RunnerConfig`` is the one declaration of every runner setting: its name, its default and its
rules (the choices of its ``Literal`` type, the bounds given to ``setting``, the rules between
fields in ``check_fields``). The scenario's ``runner:`` section is derived from it
(``mrv2_prof.scenario``), so a YAML file and a test that builds a ``RunnerConfig`` get the same
defaults and the same errors. This module imports torch only where a device or a dtype is
resolved: the scenario validates against it in processes that never load torch. It sits at the
bottom of the runner: it imports none of its sub-packages (docs/architecture.md).
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16")
Device = Literal["auto", "cuda", "cpu"]
Kernels = Literal["triton", "torch"]
# projections_triton.DECODE_GEMV; auto: kernel_paths.resolved_paths picks by the model's width
DecodeGemv = Literal["auto", "plain", "fused", "fused_onepass", "hybrid", "off"]
# worker/kernel_paths.py; auto: narrow where PDL can run (resolved_paths), else cublas
DecodeGemm = Literal["auto", "cublas", "triton", "narrow"]
PiecewiseCapture = Literal["auto", "startup", "first_use"]
CudagraphMode = Literal["full", "piecewise", "full_and_piecewise", "none"]


def __getattr__(name: str) -> Any:
    """``DTYPES`` (name -> torch dtype) is built on first use, so importing needs no torch."""
    if name == "DTYPES":
        import torch

        return {n: getattr(torch, n) for n in DTYPE_NAMES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


NO_CUDA = (
    "'cuda' requested but no CUDA device is available; "
    "run on the CPU with --set runner.device=cpu (or device: auto)"
)
CPU_KV_CACHE_BYTES = 4 * 2**30  # the KV-cache budget of num_kv_blocks: auto on a CPU


class ConfigError(ValueError):
    """A runner setting that cannot be honoured; the message names the field.

    Raised by ``RunnerConfig`` for one of its fields, ``field`` names it (``max_num_seqs``) and
    ``problem`` is the message without the ``runner.<field>: `` prefix.
    """

    def __init__(self, message: str, field: str | None = None, problem: str | None = None):
        super().__init__(message)
        self.field = field
        self.problem = problem if problem is not None else message


def invalid(name: str, problem: str) -> ConfigError:
    """The error for runner field ``name``: ``runner.<name>: <problem>``."""
    return ConfigError(f"runner.{name}: {problem}", field=name, problem=problem)


_OPS = {"ge": (">=", operator.ge), "gt": (">", operator.gt), "le": ("<=", operator.le)}


@dataclass(frozen=True)
class Bounds:
    """Inclusive (``ge``, ``le``) or exclusive (``gt``) bounds on a number."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    def given(self) -> dict[str, float]:
        """The bounds that are set, as keyword arguments (``ge=1``)."""
        return {k: v for k, v in vars(self).items() if v is not None}

    def text(self) -> str:
        return " and ".join(f"{_OPS[k][0]} {v}" for k, v in self.given().items())

    def problem(self, value: Any) -> str | None:
        for k, bound in self.given().items():
            op, holds = _OPS[k]
            if not holds(value, bound):
                return f"must be {op} {bound}, got {value}"
        return None


def setting(
    default: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    auto: bool = False,
    in_scenario: bool = True,
) -> Any:
    """A ``RunnerConfig`` field with its rules: bounds on the value (on each item of a tuple);
    ``auto``: None means "derived at start-up" and a scenario spells it ``auto``;
    ``in_scenario``: False for a field a scenario sets elsewhere (the top-level ``seed``)."""
    metadata = {"bounds": Bounds(ge, gt, le), "auto": auto, "in_scenario": in_scenario}
    return field(default=default, metadata=metadata)


SPEC_METHODS = ("none", "ngram", "draft_model")
DRAFT_ON = ("auto", "device", "host")
MAX_SPECULATIVE_TOKENS = 16  # one verify row per draft: the rows of a request stay small
MAX_NGRAM = 64  # the lookup compares every window of the history: a longer n finds nothing
# A placeholder draft slot (vLLM's -1): a request padded up to the step's k carries it after its
# real drafts; it is scheduled and given a KV slot like a draft, and never accepted.
PAD_DRAFT = -1
# A draft slot whose token the host does not know (``draft_on: device``): the verify reads the
# request slot's drafts on the device; a slot past the drafts it has is a placeholder.
DEVICE_DRAFT = -2


@dataclass(frozen=True)
class SpecDecodeConfig:
    """Speculative decoding settings (``runner.spec_decode``), validated once and frozen.

    ``method`` picks the drafter: ``none`` (off), ``ngram`` (prompt lookup over the request's
    prompt and output tokens, core/ngram_proposer.py) or ``draft_model`` (a second model run on
    the device, worker/spec_decode/draft_model.py: exactly one of ``draft_preset``,
    ``draft_path`` or ``draft_target_layers``, the target's first N layers with its final norm
    and LM head; the checks that need the models, the vocabulary and N's range, are
    ``draft_model.draft_problem``). Each speculating decode proposes up to
    ``num_speculative_tokens`` drafts; with ``dynamic_k`` the step's k comes from the batch size
    instead: the k of the smallest ``batch_size_upper_bound`` at or above the number of running
    requests, and 0 (no drafts) above the largest bound.

    ``draft_on`` says where the drafts are made and kept: ``device`` (the default through
    ``auto``) drafts on the device after each step (the n-gram lookup over a device copy of each
    request's tokens, ``ngram_device.py``; a draft model's proposals as they come out of it) and
    the next verify reads them there, so the scheduler schedules ``1 + k`` slots per decoding
    request without knowing the drafts and, under async scheduling, no request waits for its
    last tokens; ``host`` drafts from the host's token history (``NgramIndex``; the draft
    model's proposals copied back) and schedules exactly the drafts it has, so under async
    scheduling a speculating request sits out every other step. ``adaptive`` (default: on with
    ``dynamic_k``) lets the measured acceptance and step times turn the step's k down to 0 where
    speculation does not pay (core/adaptive_k.py).
    """

    method: str = "none"
    num_speculative_tokens: int = 4
    # ((batch size upper bound, k), ...) sorted by bound; None: always num_speculative_tokens
    dynamic_k: tuple[tuple[int, int], ...] | None = None
    ngram_min: int = 2
    ngram_max: int = 4
    draft_preset: str | None = None
    draft_path: str | None = None
    draft_target_layers: int | None = None
    draft_on: str = "auto"
    adaptive: bool | None = None  # None: on with dynamic_k

    def __post_init__(self) -> None:
        for name, problem in self.problems():
            raise invalid(f"spec_decode.{name}", problem)

    def problems(self) -> Iterator[tuple[str, str]]:
        """``(field under spec_decode, problem)``, the first to fix first."""
        if self.method not in SPEC_METHODS:
            yield "method", f"{self.method!r} is not one of {', '.join(SPEC_METHODS)}"
        if self.draft_on not in DRAFT_ON:
            yield "draft_on", f"{self.draft_on!r} is not one of {', '.join(DRAFT_ON)}"
        if self.method == "draft_model":
            given = [
                name
                for name, value in (
                    ("preset", self.draft_preset),
                    ("path", self.draft_path),
                    ("target_layers", self.draft_target_layers),
                )
                if value is not None
            ]
            if len(given) != 1:
                found = ", ".join(given) if given else "none"
                yield (
                    "draft",
                    f"method draft_model needs exactly one of preset, path or target_layers "
                    f"(found {found})",
                )
            if self.draft_target_layers is not None and self.draft_target_layers < 1:
                yield "draft.target_layers", f"must be >= 1, got {self.draft_target_layers}"
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            yield (
                "num_speculative_tokens",
                f"must be in [1, {MAX_SPECULATIVE_TOKENS}], got {self.num_speculative_tokens}",
            )
        if not 1 <= self.ngram_min <= self.ngram_max <= MAX_NGRAM:
            yield (
                "ngram.min",
                f"needs 1 <= min <= max <= {MAX_NGRAM}, got [{self.ngram_min}, {self.ngram_max}]",
            )
        bounds = [b for b, _ in self.dynamic_k or ()]
        if self.dynamic_k is not None and not self.dynamic_k:
            yield "dynamic_k", "needs at least one {batch_size_upper_bound: k} entry"
        if bounds != sorted(set(bounds)) or any(b < 1 for b in bounds):
            yield "dynamic_k", f"batch size bounds must be distinct integers >= 1, got {bounds}"
        for bound, k in self.dynamic_k or ():
            if not 0 <= k <= self.num_speculative_tokens:
                yield (
                    "dynamic_k",
                    f"k {k} for batch size {bound} is outside [0, num_speculative_tokens "
                    f"{self.num_speculative_tokens}]",
                )
                break

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @property
    def on_device(self) -> bool:
        """Drafts made and kept on the device (``draft_on`` auto or device)."""
        return self.enabled and self.draft_on != "host"

    @property
    def is_adaptive(self) -> bool:
        """Dynamic k may turn a step's k down by the measured acceptance and step times."""
        return self.enabled and (
            self.adaptive if self.adaptive is not None else bool(self.dynamic_k)
        )

    @property
    def max_k(self) -> int:
        """The most drafts any step can propose per request."""
        if not self.enabled:
            return 0
        if self.dynamic_k is None:
            return self.num_speculative_tokens
        return max(k for _, k in self.dynamic_k)

    def k_for(self, batch_size: int) -> int:
        """The step's k for ``batch_size`` running requests."""
        if not self.enabled:
            return 0
        if self.dynamic_k is None:
            return self.num_speculative_tokens
        bounds = [b for b, _ in self.dynamic_k]
        i = bisect.bisect_left(bounds, batch_size)
        return self.dynamic_k[i][1] if i < len(bounds) else 0

    def possible_ks(self, max_batch_size: int) -> list[int]:
        """Every k a step with 1..``max_batch_size`` running requests can choose, ascending."""
        return sorted({self.k_for(b) for b in range(1, max_batch_size + 1)})


@dataclass(frozen=True)
class ModelSpec:
    """Where the weights come from: a preset (random weights by ``seed``) or a local HF dir."""

    preset: str | None = "llama-tiny"
    path: str | None = None
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on CUDA
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.preset is None) == (self.path is None):
            raise ConfigError("model: give exactly one of 'preset' or 'path'")
        if self.dtype is not None and self.dtype not in DTYPE_NAMES:
            raise ConfigError(f"model.dtype: {self.dtype!r} is not one of {sorted(DTYPE_NAMES)}")


@dataclass(frozen=True)
class RunnerConfig:
    """The runner's settings; the scenario's ``runner:`` section has the same names and defaults
    (docs/scenarios.md, "Scenario reference", says what each does)."""

    device: Device = "auto"
    max_num_reqs: int = setting(1024, ge=1)  # rows of the persistent request state
    max_num_seqs: int = setting(256, ge=1)  # most requests running in one step
    max_num_batched_tokens: int = setting(8192, ge=1)
    # None: the model's own max_position_embeddings, as vLLM derives it (``for_model``)
    max_model_len: int | None = setting(None, ge=2, auto=True)
    block_size: int = setting(16, ge=1)
    # None: sized from gpu_memory_utilization after a profiling run (CUDA only)
    num_kv_blocks: int | None = setting(None, ge=1, auto=True)
    gpu_memory_utilization: float = setting(0.8, gt=0, le=1)
    enable_prefix_caching: bool = True
    kernels: Kernels = "triton"
    # the Triton bundle's decode paths (worker/kernel_paths.py; docs/roofline.md)
    decode_gemv: DecodeGemv = "auto"  # batch-1 projections
    decode_gemm: DecodeGemm = "auto"  # projections of 2-256 rows
    # None (auto): on where the run can take it (kernel_paths.resolved_paths; measured in
    # benchmarks/RESULTS.md, "Closer to the limit")
    pdl: bool | None = setting(None, auto=True)  # programmatic dependent launch (Hopper+)
    rope_in_attention: bool | None = setting(None, auto=True)  # decode attention does RoPE + KV
    split_kv: bool | None = setting(None, auto=True)  # small decode batches: keys over programs
    # batch 1: a layer's MLP in one launch (kernel_paths.py: faster on a narrow model, but its
    # float32 atomics make the bits vary from run to run, so it is asked for, never auto)
    fused_mlp: bool = False
    async_scheduling: bool = True
    staged_writes: bool = True
    uva: bool = True
    cudagraph_mode: CudagraphMode = "full_and_piecewise"
    full_step_graph: bool = True  # a FULL decode step's input build and sampling in graphs too
    # startup: every PIECEWISE size captured before the first step (vLLM); first_use: each by the
    # first step that needs it, its capture recorded on that step (cudagraph_manager.py); auto:
    # first_use with one rank, startup with tensor parallelism (cudagraph_plan.plan_graphs)
    piecewise_capture: PiecewiseCapture = "auto"
    # None: vLLM's default sizes, bounded by the workload (``plan_graphs``)
    cudagraph_capture_sizes: tuple[int, ...] | None = setting(None, ge=1, auto=True)
    tensor_parallel_size: int = setting(1, ge=1, le=8)  # ranks, one process each (CPU: gloo)
    strict: bool = False
    seed: int = setting(0, in_scenario=False)  # the scenario's top-level seed
    # the scenario's runner.spec_decode section (scenario/spec_decode_section.py)
    spec_decode: SpecDecodeConfig = setting(SpecDecodeConfig(), in_scenario=False)
    # Set from the scenario's workload, not user settings (None: unknown before it is built): its
    # most requests and the most tokens one step of it can schedule; they bound auto capture sizes
    workload_max_reqs: int | None = setting(None, ge=1, in_scenario=False)
    workload_max_step_tokens: int | None = setting(None, ge=1, in_scenario=False)

    def __post_init__(self) -> None:
        for f in fields(self):
            problem = _field_problem(f, getattr(self, f.name))
            if problem is not None:
                raise invalid(f.name, problem)
        for name, problem in check_fields(self):
            raise invalid(name, problem)

    @property
    def max_num_blocks_per_req(self) -> int:
        return -(-self.model_len // self.block_size)

    @property
    def model_len(self) -> int:
        """``max_model_len`` of a config resolved with ``for_model``."""
        if self.max_model_len is None:
            raise ConfigError("runner.max_model_len: 'auto' is resolved against the model first")
        return self.max_model_len

    @property
    def drafts_on_device(self) -> bool:
        """Speculative decoding keeps its drafts on the device (worker/spec_decode/
        device_drafts.py): ``draft_on`` auto or device, unless async scheduling with dense
        writes forces the host."""
        if not self.spec_decode.on_device:
            return False
        return self.staged_writes or not self.async_scheduling

    def for_model(self, max_position_embeddings: int) -> RunnerConfig:
        """This config with ``max_model_len: auto`` resolved to the model's own length (an
        explicit value is kept: the caller checks it against the model). A new frozen config;
        the rules between fields are checked again with the length known."""
        if self.max_model_len is not None:
            return self
        return dataclasses.replace(self, max_model_len=max_position_embeddings)

    def cpu_auto_num_kv_blocks(self, bytes_per_block: int) -> int:
        """``num_kv_blocks: auto`` on a CPU: blocks for ``max_num_seqs`` requests of
        ``max_model_len`` tokens, within ``CPU_KV_CACHE_BYTES`` (``bytes_per_block``: one block
        id over every layer). There is no profiling run to size it from, as on a GPU."""
        want = self.max_num_seqs * self.max_num_blocks_per_req
        return max(1, min(want, CPU_KV_CACHE_BYTES // max(bytes_per_block, 1)))

    def resolve_device(self) -> torch.device:
        import torch

        if self.device == "cpu":
            return torch.device("cpu")
        if self.device == "cuda" or torch.cuda.is_available():
            if not torch.cuda.is_available():
                raise invalid("device", NO_CUDA)
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


FIELD_TYPES: dict[str, Any] = typing.get_type_hints(RunnerConfig)  # resolved annotations


def choices_of(name: str) -> tuple[str, ...] | None:
    """The values a ``Literal`` field allows, else None."""
    hint = FIELD_TYPES[name]
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


def _field_problem(f: Any, value: Any) -> str | None:
    choices = choices_of(f.name)
    if choices is not None:
        return (
            None if value in choices else f"{repr(value)[:60]} is not one of {', '.join(choices)}"
        )
    bounds: Bounds = f.metadata.get("bounds", Bounds())
    if value is None or not bounds.given():
        return None
    if isinstance(value, tuple):
        if not value or any(bounds.problem(x) for x in value):
            return f"must be a non-empty list of integers {bounds.text()}, got {list(value)}"
        return None
    return bounds.problem(value)


def check_fields(c: RunnerConfig) -> Iterator[tuple[str, str]]:
    """The rules between fields, as ``(field, problem)``, the first to fix first."""
    if c.max_num_seqs > c.max_num_reqs:
        yield "max_num_seqs", f"{c.max_num_seqs} exceeds max_num_reqs {c.max_num_reqs}"
    known_len = c.max_model_len is not None  # auto: checked once resolved (``for_model``)
    if (
        known_len
        and c.num_kv_blocks is not None
        and c.num_kv_blocks * c.block_size < c.max_model_len
    ):
        yield (
            "num_kv_blocks",
            (
                f"{c.num_kv_blocks} blocks of {c.block_size} tokens cannot hold one request of "
                f"max_model_len {c.max_model_len}"
            ),
        )
    if c.async_scheduling and c.max_num_reqs < 2 * c.max_num_seqs:
        yield (
            "max_num_reqs",
            (
                f"{c.max_num_reqs} is too small for async scheduling with max_num_seqs "
                f"{c.max_num_seqs}: a finished request keeps its slot one more step, so at least "
                f"2 x max_num_seqs = {2 * c.max_num_seqs} are needed"
            ),
        )
    for size in c.cudagraph_capture_sizes or ():
        if size > c.max_num_batched_tokens:
            yield (
                "cudagraph_capture_sizes",
                (f"size {size} exceeds max_num_batched_tokens {c.max_num_batched_tokens}"),
            )
            break
