"""The launchers' specialization census under the interpreter (``triton_launch.specializations``):
every launch's key recorded, held against triton's own binder, and no census (with the reason)
where the kernel's JIT parameters cannot be read."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from test_triton_launch import cuda_binder, jit_of

from mrv2_prof.runner.model.kernel_workspace import KernelWorkspace
from mrv2_prof.runner.worker import triton_launch
from mrv2_prof.runner.worker.gumbel_argmax_triton import make_workspace
from mrv2_prof.runner.worker.triton_launch import Launcher

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the interpreter's census (CPU, TRITON_INTERPRET=1)"
)


@triton.jit(do_not_specialize=["m"])
def _census_add_kernel(x_ptr, n, m, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _census(name: str) -> set[str]:
    return triton_launch.specializations().get(name, set())


def test_the_interpreter_records_each_launchs_key_and_runs_the_kernel():
    launcher = Launcher(_census_add_kernel, name="census-probe-a")
    assert launcher.fallback is not None and "census" not in launcher.fallback
    x = torch.zeros(64, dtype=torch.float32)
    launcher((1,), x, 5, 3, BLOCK=16)
    launcher((1,), x, 7, 100, BLOCK=16)  # n and m change class neither way: one key
    launcher((1,), x[1:], 5, 3, BLOCK=16)  # 4 bytes in: not 16-byte aligned
    launcher((1,), x[4:], 16, 1, BLOCK=16)  # 16 bytes in: aligned; n % 16 == 0; m not specialised
    launcher((1,), x, 1, 3, BLOCK=32)
    assert x[:9].tolist() == [3, 3, 3, 3, 4, 3, 2, 1, 1]  # the launches ran
    assert _census("census-probe-a") == {
        "BLOCK=16; float32@16, i32, i32",
        "BLOCK=16; float32, i32, i32",
        "BLOCK=16; float32@16, %16, i32",
        "BLOCK=32; float32@16, =1, i32",
    }
    triton_launch.forget_interpreted_specializations()
    assert _census("census-probe-a") == set()


def test_census_keys_split_launches_as_tritons_binder_does():
    """Launches with one census key are launches triton's CUDA binder specialises identically,
    and launches it specialises differently never share a census key."""
    fn = jit_of(_census_add_kernel)
    binder = cuda_binder(fn)
    launcher = Launcher(_census_add_kernel, name="census-probe-b")
    rng = np.random.default_rng(1)
    pool = torch.zeros(96, dtype=torch.int64)
    spec_of_key: dict[str, tuple] = {}
    for _ in range(60):
        dtype = (torch.int32, torch.float32, torch.int64)[rng.integers(3)]
        x = pool.view(dtype)[int(rng.integers(0, 6)) :]
        n = int((1, 2, 15, 16, 17, 32)[rng.integers(6)])
        m = int((1, 16, 5)[rng.integers(3)])
        launcher((1,), x, n, m, BLOCK=32)
        key = _key_of(launcher, x, n, m)
        spec = tuple(binder(x, n, m, BLOCK=32)[1])
        assert spec_of_key.setdefault(key, spec) == spec, (key, spec)
    assert _census("census-probe-b") == set(spec_of_key)  # every launch's key, recorded
    assert len(set(spec_of_key.values())) == len(spec_of_key)  # as fine as triton, no finer
    assert len(spec_of_key) >= 6


def _key_of(launcher: Launcher, *args) -> str:
    return triton_launch.key_text((None, *launcher.key(args, {"BLOCK": 32})), cut=False)


def test_without_jit_parameters_there_is_no_census_and_the_note_says_why(monkeypatch):
    import triton.runtime.jit as jit

    def broken(*a, **k):
        raise TypeError("no such signature")

    with monkeypatch.context() as m:  # only while the launcher is made
        m.setattr(jit, "JITFunction", broken)
        launcher = Launcher(_census_add_kernel, name="census-probe-c")
    assert "no specialization census" in launcher.fallback
    assert "no such signature" in launcher.fallback
    x = torch.zeros(16, dtype=torch.float32)
    launcher((1,), x, 4, 1, BLOCK=16)
    assert x[:5].tolist() == [1, 1, 1, 1, 0]  # it still runs
    assert _census("census-probe-c") == set()
    assert any("census-probe-c" in n and "no specialization census" in n
               for n in triton_launch.notes())  # fmt: skip


@pytest.mark.parametrize("rows, splits", [(1, 1), (1, 63), (2, 63), (3, 5), (7, 1)])
def test_the_sampler_workspace_views_are_aligned_at_every_size(rows, splits):
    """Triton specialises a pointer on 16-byte alignment: the workspace's views must be
    aligned whatever the batch, or a batch size picks another compile of the sampler."""
    ws = KernelWorkspace("the sampler's workspace", "sample first", make_workspace)
    for r, s in ((1, 1), (rows, splits), (rows + 1, splits)):
        for view in ws.get(torch.device("cpu"), r * s, r):
            assert view.data_ptr() % 16 == 0, (r, s, view.shape)
