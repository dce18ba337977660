"""The sampler's RNG in Triton: bit-exact with ``sampler.random_bits`` / ``uniform_noise``.

A token's noise is a pure function of ``(seed, position, token)``: the same uint32 PCG hash as
the torch reference, on uint32 arithmetic, so a kernel computes it in-register for the tokens it
scans and never reads or writes a noise tensor. ``log`` takes ``PRECISE``: libdevice ``logf``,
the function ``torch.log`` runs on CUDA, so the Gumbel noise matches the reference bit for bit
there; the interpreter (``is_interpreted``) has no libdevice and uses ``tl.log``.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - older layouts
    from triton.language.extra.cuda import libdevice


@triton.jit
def pcg_hash(x):
    """PCG-RXS-M-XS on uint32: the same permutation as ``sampler._pcg_hash``."""
    state = x * 747796405 + 2891336453
    word = ((state >> ((state >> 28) + 4)) ^ state) * 277803737
    return (word >> 22) ^ word


@triton.jit
def row_key(seed, position):
    """uint32 key of a row from its int64 seed (high, then low word) and position (low word)."""
    key = pcg_hash((seed >> 32).to(tl.uint32))
    key = pcg_hash(key + seed.to(tl.uint32))
    return pcg_hash(key + position.to(tl.uint32))


@triton.jit
def uniform(key, cols):
    """float32 noise in (0, 1) of tokens ``cols``: ``(m + 0.5) * 2^-23``, m = the top 23 bits."""
    bits = pcg_hash(key + pcg_hash(cols.to(tl.uint32)))
    return ((bits >> 9) * 2 + 1).to(tl.int32).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def log(x, PRECISE: tl.constexpr):
    """Natural log; ``PRECISE`` uses libdevice ``logf``, the function ``torch.log`` runs on CUDA."""
    if PRECISE:
        return libdevice.log(x)
    else:
        return tl.log(x)


@triton.jit
def gumbel(key, cols, PRECISE: tl.constexpr):
    return -log(-log(uniform(key, cols), PRECISE), PRECISE)


def is_interpreted() -> bool:
    """True under ``TRITON_INTERPRET=1`` (decided by triton when the kernels were decorated)."""
    return type(pcg_hash).__name__ == "InterpretedFunction"
