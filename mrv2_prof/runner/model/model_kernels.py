"""The decoder's per-layer ops as one bundle: the torch references or the fused Triton kernels.

``runner.kernels`` picks the bundle (through the runner's ``KernelSet``); the model is built with
it and calls nothing else per layer but its GEMMs. With the Triton bundle one decoder layer of a
forward pass is nine launches: RMSNorm, the QKV GEMM, QK-norm + RoPE of q and k in place with the
KV write in the same kernel, paged attention, the output GEMM, residual add + RMSNorm, the
gate/up GEMM, SiLU-and-mul, and the down GEMM with the residual add in its epilogue
(``add_linear_inplace``: cuBLAS's C += A @ B). Where the KV write runs on its own (the eager
attention between PIECEWISE graph pieces) it is a tenth. The torch bundle is the reference path
(the CPU path, the oracles of the kernels): the torch decoder's arithmetic, one op at a time,
with new tensors.

The Triton bundle mutates the residual stream in place (``fused_add_rmsnorm`` and
``add_linear``): a decoder layer's ``post_attention(x, attn)`` may update ``x``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from mrv2_prof.runner.model.activation_triton import silu_and_mul_ref
from mrv2_prof.runner.model.attention import paged_attention_ref, write_kv_ref
from mrv2_prof.runner.model.norm_triton import fused_add_rmsnorm_ref, rmsnorm_ref
from mrv2_prof.runner.model.rotary_triton import qk_norm_rope_ref

WriteKV = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
Attend = Callable[..., torch.Tensor]


def add_linear_ref(
    residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """residual + x @ weight.T (+ bias), as a new tensor."""
    return residual + F.linear(x, weight, bias)


@dataclass(frozen=True)
class ModelKernels:
    name: str  # "torch" | "triton"
    write_kv: WriteKV
    attend: Attend
    rmsnorm: Callable  # (x, weight, eps) -> out
    fused_add_rmsnorm: Callable  # (x, residual, weight, eps) -> (normed, x + residual)
    qk_norm_rope: Callable  # (q, k, cos, sin, positions, q_weight, k_weight, eps) -> (q, k)
    silu_and_mul: Callable  # [T, 2I] -> [T, I]
    add_linear: Callable  # (residual, x, weight, bias) -> residual + x @ weight.T + bias
    linear: Callable  # (x, weight, bias) -> x @ weight.T + bias: the QKV, o and gate/up GEMMs
    cos_sin_cache: bool  # RoPE reads a cos/sin table built once, by position (else per step)
    rope_writes_kv: bool  # qk_norm_rope(..., v=, kv_cache=, slot_mapping=) also does write_kv

    def with_attention(
        self, write_kv: WriteKV | None = None, attend: Attend | None = None
    ) -> ModelKernels:
        """This bundle with the KV write and/or attention replaced (where given); a KV write
        other than its own is then called on its own."""
        own_write = write_kv is None or write_kv is self.write_kv
        return replace(
            self,
            write_kv=write_kv or self.write_kv,
            attend=attend or self.attend,
            rope_writes_kv=self.rope_writes_kv and own_write,
        )


TORCH_MODEL_KERNELS = ModelKernels(
    "torch",
    write_kv_ref,
    paged_attention_ref,
    rmsnorm_ref,
    fused_add_rmsnorm_ref,
    qk_norm_rope_ref,
    silu_and_mul_ref,
    add_linear_ref,
    F.linear,
    cos_sin_cache=False,
    rope_writes_kv=False,
)


def triton_model_kernels() -> ModelKernels:
    """The fused Triton bundle; raises ImportError where triton cannot be imported."""
    from mrv2_prof.runner.model.activation_triton import silu_and_mul_triton
    from mrv2_prof.runner.model.attention_triton import paged_attention_triton, write_kv_triton
    from mrv2_prof.runner.model.gemv_triton import add_linear_triton, linear_triton
    from mrv2_prof.runner.model.norm_triton import fused_add_rmsnorm_triton, rmsnorm_triton
    from mrv2_prof.runner.model.rotary_triton import qk_norm_rope_triton

    return ModelKernels(
        "triton",
        write_kv_triton,
        paged_attention_triton,
        rmsnorm_triton,
        fused_add_rmsnorm_triton,
        qk_norm_rope_triton,
        silu_and_mul_triton,
        add_linear_triton,
        linear_triton,
        cos_sin_cache=True,
        rope_writes_kv=True,
    )
