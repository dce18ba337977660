"""Which op of the model, and which layer, each kernel of a step ran: by name and by order.

A step's kernels (the ``kernels`` rows of one step, in start order) are put with the model's ops
of ``runner/model/step_cost.py``'s ``ops``:

* **GEMMs by order.** A kernel whose name says it is a matrix product (``gemm``, ``gemv``,
  ``xmma``, ``cutlass``, ``nvjet``, ``cublas``; the decode GEMV ``_gemv_kernel`` and GEMM
  ``_gemm_decode_kernel`` included) takes
  the next slot of the forward's projections: ``qkv``, ``o``, ``gate_up``, ``down`` for layer 0,
  the same for layer 1, ..., then ``lm_head``. A split-K reduction (a name with ``splitK`` and
  ``reduce``: cuBLAS's, the decode GEMM's) joins the slot of the GEMM before it. A step must
  hold exactly 4 x layers + 1 such GEMMs; otherwise (a draft model's forward in the step, a
  torch attention that multiplies with cuBLAS, a tensor-parallel shard) its GEMMs and model
  kernels are ``unattributed``, with the reason.
* **The batch-1 MLP in one launch** (``_mlp_decode_kernel``, ``mlp_decode_triton.py``) takes
  two slots at once, ``gate_up`` and ``down`` of its layer, as the op ``mlp`` (the cost's
  ``mlp``: both weights).
* **Our Triton kernels by name** (``TRITON_OPS``): RMSNorm, QK-norm + RoPE, the KV write, paged
  attention (prefill and decode; the decode kernel with RoPE and the KV write folded in counts
  as attention), SiLU-and-mul, the o or down projection's reduction with the residual add and
  the norm after it (counted as that norm: one kernel does both). Their layer is the layer of
  the next GEMM slot (each feeds the projection after it); an RMSNorm before ``gate_up`` is the
  residual add with the post-attention norm (``add_norm``), one before ``lm_head`` the final
  norm (layer None).
* **Everything else is ``other``**: input preparation, sampling, the state advance, copies and
  fills, torch's embedding lookup and elementwise kernels (the torch kernel bundle's norms
  included: only the Triton bundle's ops are named).

A FULL graph's replay is recorded kernel by kernel with the replay's step (CUPTI), so its
kernels are attributed the same way, by name and order. The capture itself (the graph's node
order and an annotation per node) is not read: a kernel is put with an op by the pattern above,
not by what the capture recorded, so a forward that breaks the pattern is reported as
unattributed rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYER_GEMMS = ("qkv", "o", "gate_up", "down")
GEMM_MARKS = ("gemm", "gemv", "xmma", "cutlass", "nvjet", "cublas")
TRITON_OPS = {
    "_rmsnorm_kernel": "norm",
    "_qk_norm_rope_kernel": "qk_rope",
    "_write_kv_kernel": "kv_write",
    "_paged_attention_kernel": "attention",
    "_paged_decode_kernel": "attention",
    "_paged_decode_rope_kernel": "attention",  # QK-norm + RoPE + KV write folded in (decode)
    "_split_kv_decode_kernel": "attention",  # split-KV decode (attention_split_kv_triton.py)
    "_split_kv_reduce_kernel": "attention",
    "_split_kv_decode_rope_kernel": "attention",  # split-KV with the RoPE fold's prologue
    "_silu_and_mul_kernel": "silu_mul",
    # the o (or down) projection's split reduction with the residual add and the norm after it,
    # in one kernel (gemm_add_norm_triton.py): counted as that norm (after o the add + norm,
    # after down the next layer's input norm or the final norm), the reduction's share with it
    "_splits_add_rmsnorm_kernel": "norm",
}
FUSED_MLP_KERNEL = "_mlp_decode_kernel"  # gate_up and down in one launch: the op "mlp"
OTHER, UNATTRIBUTED = "other", "unattributed"


@dataclass(frozen=True)
class KernelOp:
    """What one kernel ran: ``op`` (an ``ops`` key, ``other`` or ``unattributed``), ``layer``
    (None: not a layer's, such as the LM head or the final norm) and ``joins``: a split-K
    reduction, the second kernel of its GEMM's launch (the op's bytes and FLOPs counted once)."""

    op: str
    layer: int | None
    joins: bool = False


def kernel_class(name: str) -> str:
    """``split_k``, ``gemm``, ``mlp``, a Triton op of ``TRITON_OPS``, or ``other``."""
    low = name.lower()
    if "splitk" in low and "reduce" in low:
        return "split_k"
    if name.startswith(FUSED_MLP_KERNEL):
        return "mlp"
    for kernel, op in TRITON_OPS.items():
        if name.startswith(kernel):
            return op
    if any(mark in low for mark in GEMM_MARKS):
        return "gemm"
    return OTHER


def expected_gemms(layers: int) -> int:
    return len(LAYER_GEMMS) * layers + 1


def _gemm_op(slot: int, layers: int) -> tuple[str, int | None]:
    if slot >= len(LAYER_GEMMS) * layers:
        return "lm_head", None
    return LAYER_GEMMS[slot % len(LAYER_GEMMS)], slot // len(LAYER_GEMMS)


def attribute_step(names: list[str], layers: int) -> tuple[list[KernelOp], str | None]:
    """The op of each of one step's kernels (``names`` in start order), and the reason when the
    step's GEMMs do not follow the model's pattern (then they and the model's kernels are
    ``unattributed``)."""
    classes = [kernel_class(n) for n in names]
    gemms, want = classes.count("gemm") + 2 * classes.count("mlp"), expected_gemms(layers)
    if gemms != want:
        why = (
            f"{gemms} GEMM launches, expected {want} "
            f"({len(LAYER_GEMMS)} per layer x {layers} layers + the LM head)"
        )
        return [KernelOp(OTHER if c == OTHER else UNATTRIBUTED, None) for c in classes], why
    out, slot = [], -1
    for c in classes:
        if c == "gemm":
            slot += 1
            out.append(KernelOp(*_gemm_op(slot, layers)))
        elif c == "mlp":  # gate_up and down of one layer, or the pattern is broken
            nxt, layer = _gemm_op(slot + 1, layers)
            slot += 2
            out.append(KernelOp("mlp", layer) if nxt == "gate_up" else KernelOp(UNATTRIBUTED, None))
        elif c == "split_k":
            out.append(KernelOp(*_gemm_op(slot, layers), joins=True) if slot >= 0 else
                       KernelOp(UNATTRIBUTED, None))  # fmt: skip
        elif c == OTHER:
            out.append(KernelOp(OTHER, None))
        else:
            out.append(_named(c, slot + 1, layers))
    return out, None


def _named(op: str, next_slot: int, layers: int) -> KernelOp:
    """A Triton op before GEMM slot ``next_slot``: the layer of that slot."""
    if next_slot > len(LAYER_GEMMS) * layers:  # after the LM head: not the forward's
        return KernelOp(UNATTRIBUTED, None)
    nxt, layer = _gemm_op(next_slot, layers)
    if op == "norm" and nxt == "gate_up":
        op = "add_norm"
    return KernelOp(op, layer)
