"""GGUF tensor data to float: torch dequantizers for the GGML block formats a checkpoint may hold.

A quantized GGUF tensor is a run of fixed-size blocks along each row (the input features): a
block holds its scale(s) in float16 and ``block_size`` small integers. Each dequantizer here is a
handful of vectorised torch ops over all blocks at once (no Python loop over blocks), so it runs
wherever the bytes are: the loader copies a tensor's raw bytes to the target device, dequantizes
there in float32 and casts to the run's dtype. The arithmetic follows ggml's reference (and the
``gguf`` package's numpy dequantizers, which the tests compare against bit for bit): products in
float32, in the same order.

Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants Q4_K, Q5_K, Q6_K (the
types of the usual ``Q4_K_M`` / ``Q5_K_M`` / ``Q6_K`` / ``Q8_0`` files). Anything else (the
I-quants, Q2_K, Q3_K, the ternary types) is refused by ``unsupported`` before any data is read.
"""

from __future__ import annotations

import torch
from gguf.constants import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType

Q = GGMLQuantizationType
K_SCALE_SIZE = 12  # Q4_K / Q5_K: the packed 6-bit scales and mins of a super-block's 8 sub-blocks


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 at byte ``start`` of every block, as float32 [n, 1]."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _low_high(qs: torch.Tensor, width: int) -> torch.Tensor:
    """Nibbles of ``qs`` [n, m] in ggml's order: each ``width``-byte chunk gives its low nibbles,
    then its high ones; [n, 2m] uint8."""
    n = qs.shape[0]
    chunks = qs.reshape(n, -1, 1, width)
    return torch.cat((chunks & 0x0F, chunks >> 4), dim=2).reshape(n, -1)


def _bits(qh: torch.Tensor) -> torch.Tensor:
    """Bit i of the little-endian bytes ``qh`` [n, m] at column i: [n, 8m] uint8 (0 or 1)."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device)
    return ((qh[:, :, None] >> shifts) & 1).reshape(qh.shape[0], -1)


# The float32 arithmetic runs in place on the one [n, block] float tensor (the same roundings,
# operation by operation, as a fresh tensor per operation, without a full-size allocation each).


def _q8_0(b: torch.Tensor) -> torch.Tensor:  # d: f16, qs: 32 x int8
    return b[:, 2:].view(torch.int8).float().mul_(_f16(b, 0))


def _q4_0(b: torch.Tensor) -> torch.Tensor:  # d, qs: 16 bytes; x = (q - 8) * d
    q = _low_high(b[:, 2:], 16).to(torch.int8) - 8
    return q.float().mul_(_f16(b, 0))


def _q4_1(b: torch.Tensor) -> torch.Tensor:  # d, m, qs: 16 bytes; x = q * d + m
    return _low_high(b[:, 4:], 16).float().mul_(_f16(b, 0)).add_(_f16(b, 2))


def _q5_0(b: torch.Tensor) -> torch.Tensor:  # d, qh: 4 bytes (the fifth bits), qs: 16 bytes
    q = (_low_high(b[:, 6:], 16) | (_bits(b[:, 2:6]) << 4)).to(torch.int8) - 16
    return q.float().mul_(_f16(b, 0))


def _q5_1(b: torch.Tensor) -> torch.Tensor:  # d, m, qh: 4 bytes, qs: 16 bytes
    q = _low_high(b[:, 8:], 16) | (_bits(b[:, 4:8]) << 4)
    return q.float().mul_(_f16(b, 0)).add_(_f16(b, 2))


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: the 8 sub-blocks' 6-bit scales and mins from 12 packed bytes, as float32."""
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat((d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)), dim=-1)
    mn = torch.cat((m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)), dim=-1)
    return sc.float(), mn.float()


def _q4_k(b: torch.Tensor) -> torch.Tensor:  # d, dmin, scales: 12, qs: 128 (256 values)
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b, 0) * sc).reshape(n, -1, 1)
    dm = (_f16(b, 2) * mn).reshape(n, -1, 1)
    q = _low_high(b[:, 16:], 32).reshape(n, -1, 32).float()
    return (d * q - dm).reshape(n, QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:  # d, dmin, scales: 12, qh: 32, qs: 128
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b, 0) * sc).reshape(n, -1, 1)
    dm = (_f16(b, 2) * mn).reshape(n, -1, 1)
    low = _low_high(b[:, 48:], 32).reshape(n, -1, 32)
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device).reshape(1, 8, 1)
    high = (b[:, 16:48].reshape(n, 1, 32) >> shifts) & 1  # [n, 8 sub-blocks, 32]
    return (d * (low | (high << 4)).float() - dm).reshape(n, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:  # ql: 128, qh: 64, scales: 16 x int8, d
    n = b.shape[0]
    low = _low_high(b[:, :128], 64).reshape(n, -1, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).reshape(1, 1, 4, 1)
    high = ((b[:, 128:192].reshape(n, -1, 1, 32) >> shifts) & 3).reshape(n, -1, 32)
    q = ((low | (high << 4)).to(torch.int8) - 32).reshape(n, QK_K // 16, -1).float()
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = (_f16(b, 208) * scales).reshape(n, QK_K // 16, 1)
    return (d * q).reshape(n, QK_K)


_BLOCKS = {
    Q.Q8_0: _q8_0,
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q5_0: _q5_0,
    Q.Q5_1: _q5_1,
    Q.Q4_K: _q4_k,
    Q.Q5_K: _q5_k,
    Q.Q6_K: _q6_k,
}
_PLAIN = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}
SUPPORTED_TYPES: tuple[GGMLQuantizationType, ...] = (*_PLAIN, *_BLOCKS)


def type_name(qtype: int) -> str:
    """``Q4_1`` for a known GGML type code, else the code (``99``)."""
    try:
        return GGMLQuantizationType(qtype).name
    except ValueError:
        return str(qtype)


def tensor_bytes(qtype: int, shape: tuple[int, ...]) -> int | None:
    """Bytes of a tensor of ``shape`` (rows, ..., row length) in ``qtype``; None when the type is
    unknown or the row length is not a whole number of its blocks."""
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        return None
    count = 1
    for dim in shape:
        count *= dim
    if not shape or shape[-1] % block:
        return None
    return count // block * size


def unsupported(qtype: int) -> str | None:
    """Why tensors of ``qtype`` cannot be loaded (one clause), or None when they can."""
    if qtype in SUPPORTED_TYPES:
        return None
    names = ", ".join(t.name for t in SUPPORTED_TYPES)
    return f"type {type_name(qtype)} is not supported (supported: {names})"


def dequantize(
    raw: torch.Tensor, qtype: int, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """``raw`` (the tensor's bytes, uint8 [nbytes], on any device) as a ``dtype`` tensor of
    ``shape`` on the same device, computed in float32 (plain float types are only cast)."""
    plain = _PLAIN.get(qtype)
    if plain is not None:
        return raw.view(plain).reshape(shape).to(dtype)
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    values = _BLOCKS[GGMLQuantizationType(qtype)](raw.reshape(-1, size))
    return values.reshape(shape).to(dtype)
