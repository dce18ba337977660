"""The kernels' shared workspace (``kernel_workspace.KernelWorkspace``): sized to the largest
launch, reused, at least doubled when it grows, grown-out buffers kept alive for the graphs that
captured them, never grown during a capture, one set per device; and the fused MLP's buffers."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from mrv2_prof.runner.model import mlp_decode_triton
from mrv2_prof.runner.model.kernel_workspace import KernelWorkspace

CPU = torch.device("cpu")


def make_pair(device, a: int, b: int):
    return torch.zeros(a, device=device), torch.zeros(b, dtype=torch.int32, device=device)


def test_sizes_reuse_and_doubling():
    made = []
    ws = KernelWorkspace("the test workspace", "run it eagerly", lambda d, *n: made.append(n) or
                         make_pair(d, *n))  # fmt: skip
    first = ws.get(CPU, 5, 3)
    assert [t.numel() for t in first] == [5, 3] and ws.buffers(CPU) is first
    assert ws.get(CPU, 5, 1) is first and ws.get(CPU, 2, 3) is first  # fits: nothing made
    grown = ws.get(CPU, 6, 1)  # one size short: each size at least doubled, the other kept
    assert [t.numel() for t in grown] == [10, 6]
    assert [t.numel() for t in ws.get(CPU, 30, 2)] == [30, 12]  # more than double: as asked
    assert made == [(5, 3), (10, 6), (30, 12)]


def test_grown_out_buffers_stay_alive():
    """A captured graph may still read a grown-out buffer: the workspace keeps it."""
    ws = KernelWorkspace("the test workspace", "run it eagerly", make_pair)
    old = weakref.ref(ws.get(CPU, 4, 4)[0])
    ws.get(CPU, 8, 4)
    gc.collect()
    assert old() is not None


def test_never_grows_during_a_capture(monkeypatch):
    ws = KernelWorkspace("the test workspace", "run a batch of this size eagerly", make_pair)
    cuda = torch.device("cuda")
    ws._sizes[cuda], ws._buffers[cuda] = (8, 8), make_pair(CPU, 8, 8)  # as if sized eagerly
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert ws.get(cuda, 8, 2) is ws.buffers(cuda)  # fits: nothing allocated, nothing raised
    with pytest.raises(RuntimeError) as err:
        ws.get(cuda, 9, 2)
    assert str(err.value) == (
        "the test workspace grows during a CUDA graph capture: run a batch of this size eagerly "
        "before capturing"
    )
    with pytest.raises(RuntimeError, match="grows during a CUDA graph capture"):
        ws.get(torch.device("cuda", 1), 1, 1)  # a device with none yet: its first buffers too


def test_one_set_per_device():
    ws = KernelWorkspace("the test workspace", "run it eagerly", make_pair)
    meta = torch.device("meta")
    on_cpu, on_meta = ws.get(CPU, 4, 2), ws.get(meta, 16, 2)
    assert on_meta[0].device == meta and on_cpu[0].device == CPU
    assert ws.get(CPU, 4, 2) is on_cpu and [t.numel() for t in on_cpu] == [4, 2]


def test_the_fused_mlp_workspace_is_zeros_of_the_hidden_row():
    sums, counter = mlp_decode_triton.make_workspace(CPU, 7)
    assert sums.dtype == torch.float32 and sums.shape == (7,) and not sums.any()
    assert counter.dtype == torch.int32 and counter.shape == (1,) and counter.item() == 0
