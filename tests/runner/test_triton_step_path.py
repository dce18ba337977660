"""The step path's Triton kernels (input prep with the block-table gather, the staged writes, the
one-launch sampler, the state advance), forced in under the interpreter with the model's torch
kernels (the model's Triton kernels have their own tests; interpreted they are slow), reproduce
the run recorded before they changed: the same scheduler decisions and tokens, sync and async,
through preemption, aborts, chunked prefill and prefix hits. Each kernel launches through its cached
launcher, which under the interpreter takes the JIT path with a recorded note."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from host_path_trace import FIXTURE, engine_trace

RECORDED = json.loads(FIXTURE.read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs only without CUDA")
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_triton_step_path_reproduces_the_recorded_run(mode, monkeypatch):
    import mrv2_prof.runner.worker.model_runner as model_runner
    from mrv2_prof.runner.worker import step_advance_triton, triton_launch
    from mrv2_prof.runner.worker.kernel_set import TORCH, triton_kernels

    # named "torch": the Triton warm-up's dummy runs write KV slot -1, which only the model's
    # Triton KV write skips
    step_path = dataclasses.replace(triton_kernels(), model=TORCH.model, name="torch")
    monkeypatch.setattr(model_runner, "resolve_kernels", lambda r, c: (step_path, None))
    calls = step_advance_triton._advance.calls
    got = engine_trace(0, mode == "async")
    want = RECORDED[f"engine-{mode}-0"]
    for i, (g, w) in enumerate(zip(got["steps"], want["steps"], strict=False)):
        assert g == w, f"step {i}: got {g!r}, recorded {w!r}"
    assert got == want
    assert step_advance_triton._advance.calls > calls + len(got["steps"]) // 2
    assert any("_advance_kernel" in n and "interpreter" in n for n in triton_launch.notes())
