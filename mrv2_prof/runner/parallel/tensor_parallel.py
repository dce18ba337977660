"""Megatron-style tensor parallelism over ``torch.distributed`` (gloo on the CPU, NCCL on CUDA):
the collectives and the layer ops that call them.

A rank holds ``1/N`` of every layer (``shard.py``): the merged QKV and gate/up projections are
column-parallel (split by heads and by columns, no communication), the output and down
projections row-parallel (each rank's partial sum, then one all-reduce), the embedding and the
LM head vocab-parallel (an all-reduce of the masked lookups; an all-gather of the logits). A
layer so costs two all-reduces, after attention and after the MLP, as in vLLM.

``tp_kernels`` wraps a layer bundle (``ModelKernels``): the two ops that end in a row-parallel
GEMM (``add_norm_linear``, ``mlp_down``) are split at the all-reduce: partial GEMM, all-reduce,
then the residual add and norm of the unsharded op. Everything else (QKV with its input norm,
QK-norm + RoPE, the KV write, paged attention) runs on the rank's heads unchanged. The fused
Triton bundle cannot be split so: a run with ``kernels: triton`` and more than one rank uses the
torch ops and says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mrv2_prof.runner.model.activation_triton import silu_and_mul_ref
from mrv2_prof.runner.model.model_kernels import TORCH_MODEL_KERNELS, ModelKernels
from mrv2_prof.runner.model.norm_triton import fused_add_rmsnorm_ref


@dataclass(frozen=True)
class TPGroup:
    """This process's place in the tensor-parallel group (``world`` 1: no communication)."""

    rank: int = 0
    world: int = 1
    group: object | None = None  # a torch.distributed process group; None: the default one
    # host ns spent in collectives so far (gloo on the CPU is synchronous: that is their time)
    comm_ns: list[int] = field(default_factory=lambda: [0], compare=False)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            t0 = time.perf_counter_ns()
            dist.all_reduce(x, group=self.group)
            self.comm_ns[0] += time.perf_counter_ns() - t0
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Each rank's [..., n] into [..., world * n], rank order."""
        if self.world == 1:
            return x
        t0 = time.perf_counter_ns()
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        self.comm_ns[0] += time.perf_counter_ns() - t0
        return torch.cat(parts, dim=-1)

    def split(self, n: int, what: str) -> tuple[int, int]:
        """This rank's ``[start, end)`` of ``n`` rows split evenly."""
        if n % self.world:
            raise ValueError(f"{what}: {n} does not divide by tensor_parallel_size {self.world}")
        per = n // self.world
        return self.rank * per, (self.rank + 1) * per


SPLIT_SIZES = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")


def tp_problem(world: int, args, on_gpu: bool, spec_method: str = "none") -> str | None:
    """Why ``runner.tensor_parallel_size: world`` cannot run this model here (None: it can)."""
    if world == 1:
        return None
    if spec_method != "none":
        return (
            f"{world} ranks do not run speculative decoding yet; "
            "set runner.spec_decode.method: none"
        )
    if on_gpu:
        return (
            f"{world} ranks run on the CPU (gloo) only so far; set runner.device: cpu, or "
            "tensor_parallel_size: 1 on a GPU"
        )
    for name in SPLIT_SIZES:
        if getattr(args, name) % world:
            return f"{world} does not divide the model's {name} ({getattr(args, name)})"
    return None


def tp_kernels(base: ModelKernels, tp: TPGroup) -> ModelKernels:
    """``base`` with its row-parallel ops split at their all-reduce."""
    if tp.world == 1:
        return base

    def add_norm_linear(x, attn, o_weight, o_bias, norm_weight, eps, weight):
        partial = F.linear(attn, o_weight, o_bias if tp.rank == 0 else None)
        h, x = fused_add_rmsnorm_ref(tp.all_reduce(partial), x, norm_weight, eps)
        return F.linear(h, weight), x

    def mlp_down(x, gate_up, weight):
        return x + tp.all_reduce(F.linear(silu_and_mul_ref(gate_up), weight))

    return replace(
        base, name=f"{base.name}+tp{tp.world}", add_norm_linear=add_norm_linear,
        mlp_down=mlp_down, add_norm_mlp=None,  # the two ops above, each with its all-reduce
        fuses_down_norm=TORCH_MODEL_KERNELS.fuses_down_norm,  # its norm would skip the all-reduce
    )  # fmt: skip
