"""The torch dequantizers against the ``gguf`` package's numpy ones (bit for bit, every supported
type) and against blocks worked out by hand from ggml's block layouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from mrv2_prof.runner.model.gguf_dequant import (
    SUPPORTED_TYPES,
    dequantize,
    tensor_bytes,
    unsupported,
)

Q = GGMLQuantizationType
ROWS, COLS = 6, 512  # two K-quant super-blocks, sixteen 32-blocks per row
F16 = {1.0: 0x3C00, 2.0: 0x4000, 0.5: 0x3800, 0.25: 0x3400, -1.0: 0xBC00, -2.0: 0xC000}


def quantized(qtype: GGMLQuantizationType, seed: int = 0) -> np.ndarray:
    """[ROWS, bytes per row] uint8 of ``qtype``: the gguf package's quantizer on normal values,
    or (K-quants, which it only dequantizes) random bytes with finite float16 scales."""
    rng = np.random.default_rng(seed)
    try:
        data = gguf_quantize(rng.standard_normal((ROWS, COLS)).astype(np.float32), qtype)
        return np.ascontiguousarray(data).view(np.uint8).reshape(ROWS, -1)
    except NotImplementedError:
        pass
    block, size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (ROWS * COLS // block, size), dtype=np.uint8)
    scales = rng.uniform(-2, 2, (len(data), 2)).astype(np.float16).view(np.uint8)
    if qtype == Q.Q6_K:  # d is the last two bytes
        data[:, 208:210] = scales[:, :2]
    else:  # d, dmin first
        data[:, :4] = scales
    return data.reshape(ROWS, -1)


def ours(data: np.ndarray, qtype: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    raw = torch.from_numpy(np.ascontiguousarray(data).reshape(-1).copy())
    return dequantize(raw, qtype, (ROWS, COLS) if data.ndim == 2 else (COLS,), dtype)


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_equals_the_gguf_packages_dequantizer(qtype):
    data = quantized(qtype)
    assert data.nbytes == tensor_bytes(qtype, (ROWS, COLS))
    expected = torch.from_numpy(gguf_dequantize(data, qtype).astype(np.float32))
    got = ours(data, qtype)
    assert got.dtype == torch.float32 and got.shape == (ROWS, COLS)
    assert torch.equal(got, expected.reshape(ROWS, COLS))
    # cast to the run's dtype after the float32 arithmetic
    assert torch.equal(ours(data, qtype, torch.bfloat16), expected.to(torch.bfloat16))


def block(*parts: bytes, size: int) -> np.ndarray:
    raw = b"".join(parts)
    assert len(raw) == size
    return np.frombuffer(raw, dtype=np.uint8)


def f16(value: float) -> bytes:
    return F16[value].to_bytes(2, "little")


def check_block(qtype: GGMLQuantizationType, data: np.ndarray, expected: dict[int, float]):
    """One block (tiled to a row of COLS values, the same block everywhere): the values at the
    given positions as worked out by hand; the rest equal the value at position ``-1``."""
    block_size, _ = GGML_QUANT_SIZES[qtype]
    row = np.tile(data, COLS // block_size)
    got = ours(row, qtype)[:block_size]
    want = torch.full((block_size,), expected.pop(-1))
    for position, value in expected.items():
        want[position] = value
    assert torch.equal(got, want), (got, want)
    assert (ours(row, qtype).reshape(-1, block_size) == want).all()


def test_q8_0_block_by_hand():
    # d = 0.5; x = q * d
    qs = np.array([-128, -1, 0, 1, 127] + [3] * 27, dtype=np.int8).tobytes()
    data = block(f16(0.5), qs, size=34)
    check_block(Q.Q8_0, data, {0: -64.0, 1: -0.5, 2: 0.0, 3: 0.5, 4: 63.5, -1: 1.5})


def test_q4_0_block_by_hand():
    # d = 2; x = (q - 8) * d; byte j holds value j (low nibble) and value j + 16 (high nibble)
    qs = bytes([0xF0, 0x18] + [0x88] * 14)
    data = block(f16(2.0), qs, size=18)
    check_block(Q.Q4_0, data, {0: -16.0, 16: 14.0, 1: 0.0, 17: -14.0, -1: 0.0})


def test_q4_1_block_by_hand():
    # d = 0.25, m = -1; x = q * d + m
    qs = bytes([0xF0] + [0x00] * 15)
    data = block(f16(0.25), f16(-1.0), qs, size=20)
    check_block(Q.Q4_1, data, {0: -1.0, 16: 2.75, -1: -1.0})


def test_q5_0_block_by_hand():
    # d = 1; the fifth bit of value i is bit i of the little-endian qh; x = (q - 16) * d
    qh = bytes([0x01, 0x00, 0x01, 0x00])  # values 0 and 16
    qs = bytes([0x3F] + [0x00] * 15)
    data = block(f16(1.0), qh, qs, size=22)
    check_block(Q.Q5_0, data, {0: 15.0, 16: 3.0, -1: -16.0})


def test_q5_1_block_by_hand():
    # d = 0.5, m = 1; x = q * d + m
    qh = bytes([0x01, 0x00, 0x01, 0x00])
    qs = bytes([0x3F] + [0x00] * 15)
    data = block(f16(0.5), f16(1.0), qh, qs, size=24)
    check_block(Q.Q5_1, data, {0: 16.5, 16: 10.5, -1: 1.0})


def test_plain_types_by_hand():
    for qtype, raw, values in (
        (Q.F32, np.array([1.5, -2.25], dtype=np.float32).tobytes(), [1.5, -2.25]),
        (Q.F16, f16(1.0) + f16(-2.0), [1.0, -2.0]),
        (Q.BF16, bytes([0x80, 0x3F, 0x40, 0xC0]), [1.0, -3.0]),  # 0x3F80, 0xC040
    ):
        data = np.frombuffer(raw * (COLS // 2), dtype=np.uint8)
        got = ours(data, qtype)
        assert torch.equal(got[:2], torch.tensor(values)) and got.shape == (COLS,)


def test_q4_k_block_by_hand():
    # d = 1, dmin = 0.5; sub-block j (32 values) is d * sc_j * q - dmin * m_j, with 6-bit sc/m:
    # sc_0..3 / m_0..3 in bytes 0-3 / 4-7; sc_4..7 / m_4..7 in the low / high nibbles of bytes 8-11
    scales = bytes([2, 0, 0, 0, 3, 0, 0, 0, 0x21, 0, 0, 0])  # sc0 2, m0 3, sc4 1, m4 2
    qs = bytearray(128)  # 32-byte chunk c: sub-block 2c in the low nibbles, 2c + 1 in the high
    qs[0] = 0x57  # value 0: 7; value 32: 5
    qs[64] = 0x03  # value 128 (sub-block 4): 3
    data = block(f16(1.0), f16(0.5), scales, bytes(qs), size=144)
    # sub-blocks 1-3 and 5-7 have scale and min 0
    expected = {0: 2 * 7 - 1.5, 32: 0.0, 128: 3 - 1.0, -1: 0.0}
    expected.update({i: -1.5 for i in range(1, 32)})
    expected.update({i: -1.0 for i in range(129, 160)})
    check_block(Q.Q4_K, data, expected)


def test_q5_k_block_by_hand():
    # as Q4_K, plus a fifth bit: bit j of qh[i] for value 32 j + i
    scales = bytes([1, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0])  # sc0 1, m0 0; sc1 1, m1 2
    qh = bytes([0b11] + [0] * 31)
    qs = bytes([0x34] + [0] * 127)  # value 0: 4; value 32: 3
    data = block(f16(1.0), f16(1.0), scales, qh, qs, size=176)
    expected = {0: 20.0, 32: 19.0 - 2.0, -1: 0.0}
    expected.update({i: -2.0 for i in range(33, 64)})
    check_block(Q.Q5_K, data, expected)


def test_q6_k_block_by_hand():
    # x = d * scale_(i // 16) * (q - 32), q = 4 low bits from ql | 2 high bits from qh << 4;
    # ql byte b < 64: value b (low nibble), b + 64 (high); qh byte b < 32: values b, b + 32,
    # b + 64, b + 96 in bit pairs 0-1, 2-3, 4-5, 6-7 (bytes 64+ / 32+ for values 128+)
    ql = bytes([0x21] + [0] * 127)  # value 0: 1; value 64: 2
    qh = bytes([0b0110] + [0] * 63)  # value 0: 2; value 32: 1
    scales = np.array([2, 2, -1] + [0] * 13, dtype=np.int8).tobytes()
    data = block(ql, qh, scales, f16(0.5), size=210)
    expected = {0: 1.0, 32: 8.0, 64: 0.0, -1: 0.0}
    expected.update({i: -32.0 for i in range(1, 32)})  # q - 32 = -32, scale 2 * 0.5
    expected.update({i: 16.0 for i in range(33, 48)})  # scale -1 * 0.5
    check_block(Q.Q6_K, data, expected)


def test_types_it_cannot_read_are_named():
    assert unsupported(Q.Q4_1) is None
    problem = unsupported(Q.Q2_K)
    assert problem.startswith("type Q2_K is not supported (supported: F32, F16, BF16, Q8_0")
    assert unsupported(999).startswith("type 999 is not supported")
    assert tensor_bytes(Q.Q4_1, (3, 64)) == 3 * 2 * 20
    assert tensor_bytes(Q.Q4_1, (3, 40)) is None  # not whole blocks
    assert tensor_bytes(999, (3, 64)) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_dequantizes_on_the_device(qtype):
    """The bytes copied to the GPU and dequantized there: the same values as on the CPU."""
    data = quantized(qtype, seed=3)
    raw = torch.from_numpy(data.reshape(-1).copy())
    on_gpu = dequantize(raw.cuda(), qtype, (ROWS, COLS), torch.bfloat16)
    assert on_gpu.device.type == "cuda"
    assert torch.equal(on_gpu.cpu(), dequantize(raw, qtype, (ROWS, COLS), torch.bfloat16))
