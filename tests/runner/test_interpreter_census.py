"""The census of directly launched kernels under the interpreter (``interpreter_census``): each
``kernel[grid](...)`` recorded with the key triton would compile it for, worked out by hand
here and held against triton's own CUDA binder; launcher kernels left to their own census."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from test_triton_launch import cuda_binder, jit_of

from mrv2_prof.runner.worker import interpreter_census, triton_launch
from mrv2_prof.runner.worker.triton_launch import Launcher

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the interpreter's census (CPU, TRITON_INTERPRET=1)"
)


# a constexpr between runtime parameters, one with a default; m not specialised on its value,
# y_ptr not on its alignment
@triton.jit(do_not_specialize=["m"], do_not_specialize_on_alignment=["y_ptr"])
def _direct_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, m, scale, ADD: tl.constexpr = 1):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + ADD, mask=mask)


@triton.jit
def _via_launcher_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def test_each_direct_launch_records_its_hand_worked_key_and_runs():
    x = torch.zeros(64, dtype=torch.float32)
    y = torch.zeros(64, dtype=torch.int64)
    with interpreter_census.recording():
        _direct_kernel[(1,)](x, y, 5, 16, 3, 0.5)
        _direct_kernel[(1,)](x, y[1:], 7, 16, 100, 2.0)  # y's alignment and m: not specialised
        _direct_kernel[(1,)](x[1:], y, n=16, BLOCK=16, m=1, scale=1.0, num_warps=2)
        _direct_kernel[(1,)](x[4:], y, 1, BLOCK=32, m=2**40, scale=0.0, ADD=3)
        _direct_kernel[(1,)](x, y, 2**31 + 1, 8, -(2**31) - 1, 1.0)  # n, m 64-bit
    x[:] = 0
    _direct_kernel[(1,)](x, y, 17, 16, 3, 0.5)  # not recording: not recorded, still runs
    assert x[:17].tolist() == [1.0] * 16 + [0.0]
    F = repr(float)  # a float argument: fp32 whatever its value
    assert interpreter_census.specializations() == {
        "_direct_kernel": {
            f"BLOCK=16, ADD=1; float32@16, int64, i32, i32, {F}",
            f"BLOCK=16, ADD=1, num_warps=2; float32, int64, %16, i32, {F}",
            f"BLOCK=32, ADD=3; float32@16, int64, =1, i64, {F}",
            f"BLOCK=8, ADD=1; float32@16, int64, i64, i64, {F}",
        }
    }


def test_keys_split_launches_as_tritons_binder_does():
    """Launches with one census key are launches triton's CUDA binder specialises alike, and
    launches it specialises differently never share one."""
    binder = cuda_binder(jit_of(_direct_kernel))
    pool = torch.zeros(64, dtype=torch.int64)
    spec_of_key: dict[str, tuple] = {}
    with interpreter_census.recording():
        for dtype in (torch.float32, torch.int32):
            for offset in (0, 1, 4):
                for n in (1, 2, 16, 17):
                    for m in (1, 16, 5):
                        x, y = pool.view(dtype)[offset:], pool[offset % 2 :]
                        key = interpreter_census.launch_key(
                            _direct_kernel, (x, y, n, 16, m, 0.5), {}
                        )
                        spec = tuple(binder(x, y, n, 16, m, 0.5)[1])
                        assert spec_of_key.setdefault(key, spec) == spec, (key, spec)
    assert len(set(spec_of_key.values())) == len(spec_of_key)  # as fine as triton, no finer
    assert len(spec_of_key) == 2 * 2 * 3  # dtype, x aligned or not, n =1 / %16 / other


def test_launcher_kernels_are_left_to_the_launchers_census():
    launcher = Launcher(_via_launcher_kernel, name="direct-census-probe")
    x = torch.zeros(16, dtype=torch.float32)
    with interpreter_census.recording():
        launcher((1,), x, 3, BLOCK=16)
        _direct_kernel[(1,)](x, x, 3, 16, 3, 0.5)
    assert x[:4].tolist() == [2, 2, 2, 0]  # both ran
    assert set(interpreter_census.specializations()) == {"_direct_kernel"}
    assert triton_launch.specializations()["direct-census-probe"] == {"BLOCK=16; float32@16, i32"}
