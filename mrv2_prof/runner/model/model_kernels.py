"""The decoder's per-layer ops as one bundle: the torch references or the fused Triton kernels.

``runner.kernels`` picks the bundle (through the runner's ``KernelSet``); the model is built with
it and a decoder layer calls nothing else: the three projection ops (``norm_linear``: input norm
+ QKV; ``add_norm_linear``: o into the residual, post-attention norm, gate/up; ``mlp_down``:
SiLU-and-mul, down into the residual), QK-norm + RoPE (with the KV write where the bundle fuses
it) and attention. With the Triton bundle a decoder layer of a forward pass is nine launches
(RMSNorm, QKV GEMM, QK-norm + RoPE + KV write, attention, o GEMM, residual add + RMSNorm, gate/up
GEMM, SiLU-and-mul, down GEMM adding into the residual: cuBLAS's C += A @ B); at batch 1 the
QKV, o and down projections are the decode GEMV instead (``projections_triton.py``, which also
holds a measured six-launch variant with the elementwise ops fused into the GEMVs). In a decode
batch, where ``folds_rope`` says so, QK-norm + RoPE + KV write and attention are one launch
(``rope_attend``, off until measured). Where the KV
write runs on its own (the eager attention between PIECEWISE graph pieces) it is one more. The
torch bundle is the reference path (the CPU path, the oracles of the kernels): the torch
decoder's arithmetic, one op at a time, with new tensors.

The Triton bundle mutates the residual stream in place (``add_norm_linear`` and ``mlp_down``): a
decoder layer's ``post_attention(x, attn)`` may update ``x``. Where it makes the norm after a
layer with that layer's down projection (``fuses_down_norm``, ``mlp_down_norm``), the layer
hands the normalised rows to the next (``DecoderLayer.step``; ``linear``: its QKV without the
norm), and after the last layer they are the final norm's.
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


def norm_linear_ref(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor, bias
) -> torch.Tensor:
    """RMSNorm of x, then ``@ weight.T (+ bias)``."""
    return F.linear(rmsnorm_ref(x, norm_weight, eps), weight, bias)


def add_norm_linear_ref(
    x: torch.Tensor,
    attn: torch.Tensor,
    o_weight: torch.Tensor,
    o_bias: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + attn @ o_weight.T) @ weight.T, x + attn @ o_weight.T); new tensors."""
    h, x = fused_add_rmsnorm_ref(F.linear(attn, o_weight, o_bias), x, norm_weight, eps)
    return F.linear(h, weight), x


def mlp_down_ref(x: torch.Tensor, gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x + silu_and_mul(gate_up) @ weight.T, as a new tensor."""
    return x + F.linear(silu_and_mul_ref(gate_up), weight)


@dataclass(frozen=True)
class ModelKernels:
    name: str  # "torch" | "triton"
    write_kv: WriteKV
    attend: Attend
    rmsnorm: Callable  # (x, weight, eps) -> out: the final norm, Qwen3's q/k norm modules
    qk_norm_rope: Callable  # (q, k, cos, sin, positions, q_weight, k_weight, eps) -> (q, k)
    norm_linear: Callable  # (x, norm_w, eps, w, b) -> rmsnorm(x) @ w.T + b: input norm + QKV
    add_norm_linear: Callable  # (x, attn, o_w, o_b, norm_w, eps, w) -> (gate_up, new x)
    mlp_down: Callable  # (x, gate_up, w) -> x + silu_and_mul(gate_up) @ w.T
    cos_sin_cache: bool  # RoPE reads a cos/sin table built once, by position (else per step)
    rope_writes_kv: bool  # qk_norm_rope(..., v=, kv_cache=, slot_mapping=) also does write_kv
    # (num_tokens, meta, kv_cache) -> whether rope_attend serves the batch: QK-norm + RoPE, the
    # KV write and attention in one launch (attention_decode_rope_triton.py)
    folds_rope: Callable[..., bool] = lambda num_tokens, meta, kv_cache: False  # noqa: E731
    rope_attend: Callable | None = None  # (q, k, v, cos, sin, positions, q_w, k_w, eps, kv_cache,
    #                                       meta, scale) -> attention output [T, h, d]
    # (x, attn, o_w, o_b, norm_w, eps, gate_up_w, down_w) -> x after o and the MLP, where the
    # bundle has its own (the Triton one: the batch-1 MLP in one launch where it is on); None:
    # add_norm_linear, then mlp_down
    add_norm_mlp: Callable | None = None
    # (x, down_w) -> whether mlp_down_norm serves the rows (host ints only); where it does,
    # (x, gate_up, down_w, next_norm_w, eps) -> the next norm's rows, x updated in place: the
    # down projection and the next layer's input norm (or the final norm) from the same
    # launches (the Triton bundle: projections_triton.DOWN_ADD_NORM); else mlp_down, then the
    # next norm as ever
    fuses_down_norm: Callable[..., bool] = lambda x, down_weight: False  # noqa: E731
    mlp_down_norm: Callable | None = None
    linear: Callable = F.linear  # (x, w, b) -> x @ w.T + b: QKV of rows already normalised

    def with_attention(
        self, write_kv: WriteKV | None = None, attend: Attend | None = None
    ) -> ModelKernels:
        """This bundle with the KV write and/or attention replaced (where given); a KV write
        other than its own is then called on its own."""
        own_write = write_kv is None or write_kv is self.write_kv
        own_attend = attend is None or attend is self.attend
        folds = self.folds_rope if own_write and own_attend else TORCH_MODEL_KERNELS.folds_rope
        return replace(
            self,
            write_kv=write_kv or self.write_kv,
            attend=attend or self.attend,
            rope_writes_kv=self.rope_writes_kv and own_write,
            folds_rope=folds,
        )


TORCH_MODEL_KERNELS = ModelKernels(
    "torch",
    write_kv_ref,
    paged_attention_ref,
    rmsnorm_ref,
    qk_norm_rope_ref,
    norm_linear_ref,
    add_norm_linear_ref,
    mlp_down_ref,
    cos_sin_cache=False,
    rope_writes_kv=False,
)


def triton_model_kernels() -> ModelKernels:
    """The fused Triton bundle; raises ImportError where triton cannot be imported."""
    from mrv2_prof.runner.model.attention_decode_rope_triton import folds_rope
    from mrv2_prof.runner.model.attention_split_kv_rope_triton import rope_attend
    from mrv2_prof.runner.model.attention_triton import paged_attention_triton, write_kv_triton
    from mrv2_prof.runner.model.norm_triton import rmsnorm_triton
    from mrv2_prof.runner.model.projections_triton import (
        add_norm_linear_triton,
        add_norm_mlp_triton,
        fuses_down_norm,
        linear_triton,
        mlp_down_norm_triton,
        mlp_down_triton,
        norm_linear_triton,
    )
    from mrv2_prof.runner.model.rotary_triton import qk_norm_rope_triton

    return ModelKernels(
        "triton",
        write_kv_triton,
        paged_attention_triton,
        rmsnorm_triton,
        qk_norm_rope_triton,
        norm_linear_triton,
        add_norm_linear_triton,
        mlp_down_triton,
        cos_sin_cache=True,
        rope_writes_kv=True,
        folds_rope=folds_rope,
        rope_attend=rope_attend,
        add_norm_mlp=add_norm_mlp_triton,
        fuses_down_norm=fuses_down_norm,
        mlp_down_norm=mlp_down_norm_triton,
        linear=linear_triton,
    )
