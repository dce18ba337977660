"""Triton's own compile hooks (runner/worker/triton_jit_hooks.py): a kernel launched directly is
reported with its name, key and time; one inside a launcher's miss is left to the launcher;
hooks set earlier still run; without triton's knobs, a note."""

from __future__ import annotations

import sys
import types

import pytest

from mrv2_prof.runner.worker import triton_launch
from mrv2_prof.runner.worker.triton_jit_hooks import UNAVAILABLE, JitHooks


@pytest.fixture
def fake_triton(monkeypatch):
    runtime = types.SimpleNamespace(jit_cache_hook=None, jit_post_compile_hook=None)
    module = types.ModuleType("triton")
    module.knobs = types.SimpleNamespace(runtime=runtime)
    monkeypatch.setitem(sys.modules, "triton", module)
    monkeypatch.setitem(sys.modules, "triton.knobs", module.knobs)
    return runtime


def _compile(runtime, name: str, key: str) -> bool:
    """What triton's JIT does on an in-memory cache miss: the pre hook, compile, the post hook."""
    fn = types.SimpleNamespace(name=f"mrv2_prof.runner.model.{name}")
    kwargs = dict(key=key, repr=f"{name}[num_warps=4](x: *bf16)", fn=fn, compile={})
    if runtime.jit_cache_hook(**kwargs):
        return False
    runtime.jit_post_compile_hook(**kwargs)
    return True


def test_a_direct_launch_compile_is_reported_with_name_key_and_time(fake_triton):
    seen = []
    hooks = JitHooks(lambda *row: seen.append(row))
    assert hooks.install() is None
    assert _compile(fake_triton, "_rms_norm_kernel", "k1")  # the compile is not skipped
    ((kernel, key, ms),) = seen
    assert kernel == "_rms_norm_kernel" and key == "_rms_norm_kernel[num_warps=4](x: *bf16)"
    assert 0 <= ms < 1_000
    hooks.uninstall()
    assert fake_triton.jit_cache_hook is None and fake_triton.jit_post_compile_hook is None


def test_a_compile_inside_a_launcher_miss_is_left_to_the_launcher(fake_triton, monkeypatch):
    seen = []
    hooks = JitHooks(lambda *row: seen.append(row))
    hooks.install()
    monkeypatch.setitem(triton_launch._state, "in_miss", True)
    _compile(fake_triton, "_advance_kernel", "k2")
    assert seen == []


def test_earlier_hooks_run_first_and_may_skip_the_compile(fake_triton):
    calls = []
    fake_triton.jit_cache_hook = lambda **kw: calls.append(("pre", kw["key"])) or kw["key"] == "x"
    fake_triton.jit_post_compile_hook = lambda **kw: calls.append(("post", kw["key"]))
    seen = []
    hooks = JitHooks(lambda *row: seen.append(row))
    hooks.install()
    assert not _compile(fake_triton, "_k", "x")  # the earlier hook skipped it: not a compile
    assert _compile(fake_triton, "_k", "y")
    assert calls == [("pre", "x"), ("pre", "y"), ("post", "y")]
    assert [row[0] for row in seen] == ["_k"]


def test_without_triton_knobs_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setitem(sys.modules, "triton.knobs", None)  # a real triton imported earlier
    assert JitHooks(print).install() == UNAVAILABLE
