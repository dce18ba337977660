"""Which implementation of each per-step op the runner uses: Triton kernels or torch references.

``runner.kernels: triton`` selects the Triton kernels (input prep, staged-write apply, the
model's fused per-layer ops with the KV write and paged attention, the Gumbel sampler, the state
advance after it) on a CUDA
device; ``torch`` selects the references, which are also the CPU path and the oracles the kernels
are tested against. When Triton was asked for but cannot be used (no CUDA device, triton not
importable) the reason is returned so the runner can record it, or refuse it under ``strict``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mrv2_prof.runner.model.model_kernels import TORCH_MODEL_KERNELS, ModelKernels
from mrv2_prof.runner.worker.input_batch import prepare_inputs_ref
from mrv2_prof.runner.worker.sampler import sample
from mrv2_prof.runner.worker.staged_write import (
    ApplyFn,
    apply_appends_ref,
    apply_packed_writes_ref,
)
from mrv2_prof.runner.worker.step_advance import advance_state_ref


@dataclass(frozen=True)
class KernelSet:
    name: str  # "triton" | "torch"
    prepare_inputs: Callable
    apply_writes: ApplyFn
    model: ModelKernels  # the decoder's per-layer ops, attention included
    sample: Callable
    advance_state: Callable = advance_state_ref  # last sampled tokens and computed counts
    apply_appends: Callable = apply_appends_ref  # single-element writes, count on the device

    @property
    def write_kv(self) -> Callable:
        return self.model.write_kv

    @property
    def attend(self) -> Callable:
        return self.model.attend


TORCH = KernelSet("torch", prepare_inputs_ref, apply_packed_writes_ref, TORCH_MODEL_KERNELS, sample)


def triton_kernels() -> KernelSet:
    from mrv2_prof.runner.model.model_kernels import triton_model_kernels
    from mrv2_prof.runner.worker.input_batch_triton import prepare_inputs_triton
    from mrv2_prof.runner.worker.sampler_triton import sample_triton
    from mrv2_prof.runner.worker.staged_write_triton import (
        apply_appends_triton,
        apply_packed_writes_triton,
    )
    from mrv2_prof.runner.worker.step_advance_triton import advance_state_triton

    return KernelSet(
        "triton",
        prepare_inputs_triton,
        apply_packed_writes_triton,
        triton_model_kernels(),
        sample_triton,
        advance_state_triton,
        apply_appends_triton,
    )


def resolve_kernels(requested: str, is_cuda: bool) -> tuple[KernelSet, str | None]:
    """The kernel set to use, and why it differs from ``requested`` (None when it does not)."""
    if requested == "torch":
        return TORCH, None
    if not is_cuda:
        return TORCH, "runner.kernels: triton kernels need a CUDA device; using torch"
    try:
        return triton_kernels(), None
    except ImportError as exc:
        return TORCH, f"runner.kernels: triton is not usable here ({exc}); using torch"
