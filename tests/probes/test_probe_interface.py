"""The no-op ``Probe`` is the runner's whole interface to instrumentation: every hook the runner
calls exists on it with the recording probe's signature, and it records nothing."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from mrv2_prof.probes import api
from mrv2_prof.probes.api import Probe
from mrv2_prof.probes.recording import RecordingProbe
from tests.probes.test_api import HOOKS


# ---- the no-op probe ----------------------------------------------------------------------------
@pytest.mark.parametrize("hook", HOOKS)
def test_noop_probe_has_every_hook_with_the_same_signature(hook):
    base, rec = getattr(Probe, hook), getattr(RecordingProbe, hook)
    assert rec is not base  # RecordingProbe records it
    assert inspect.signature(base) == inspect.signature(rec)


def test_the_hooks_are_all_the_public_methods():
    def public(cls) -> set[str]:  # defined on the class or a base (object aside)
        bases = cls.__mro__[:-1]
        return {n for c in bases for n, v in vars(c).items() if callable(v) and n[0] != "_"}

    assert public(Probe) == set(HOOKS)
    extra = {"intern", "name_of", "drain", "swap", "decode", "give_back", "unfinished", "gpu_span"}
    assert public(RecordingProbe) - set(HOOKS) == extra


def probe_calls(source: str) -> set[str]:
    """Methods called on ``self.probe`` or on a local bound from an expression naming a probe."""
    called = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef):
            continue
        local = {
            target.id
            for node in ast.walk(fn)
            if isinstance(node, ast.Assign) and "probe" in ast.unparse(node.value).lower()
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = ast.unparse(node.func.value)
                if owner in local or owner == "self.probe":
                    called.add(node.func.attr)
    return called


def test_every_hook_the_runner_calls_exists_on_the_noop_probe():
    root = Path(api.__file__).parents[1]
    called = set()
    for rel in (
        "runner/engine.py",
        "runner/worker/model_runner.py",
        "runner/worker/async_output.py",
        "runner/worker/startup.py",
    ):
        called |= probe_calls((root / rel).read_text())
    assert {"step_begin", "step_end", "step_tokens", "staged_write", "sync"} <= called
    assert called <= set(HOOKS), called - set(HOOKS)


def test_noop_probe_records_nothing():
    p = Probe()
    assert p.enabled is False and RecordingProbe.enabled is True
    p.step_begin(0)
    p.step_end(1, 1, 1, 0, 1, 1, 0, 0, "none")
    p.begin(api.FORWARD)
    p.end(api.FORWARD)
    p.staged_write("t", 1, 1, 1, 1)
    p.graph_dispatch(1, 1, "none", "none", False, "r")
    p.graph_capture("k", "full", 1, 0.1, 1)
    p.sync("k", "s", 1)
    p.sync("k", "s", 1, t_ns=5)
    p.request_arrival("a", 1, 1)
    p.token("a", 0, 1, 1)
    p.request_finish("a", 1, 1, 0, "length", 0)
    assert vars(p) == {}
