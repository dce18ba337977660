"""Triton's cache key hashed on a thread (``worker/triton_key_prefetch.py``): the thread fills
triton's own cache of the key once, so the process's next call (the first compile's) finds it;
nothing starts where the run compiles nothing; start-up joins the thread before its first
launch. The thread's tests run in a fresh interpreter (the key's cache is process-wide)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.worker import triton_key_prefetch

pytest.importorskip("triton")

SCRIPT = r"""
import json
from mrv2_prof.runner.worker import triton_key_prefetch as prefetch

triton_key = prefetch.triton_key_function()

prefetch.will_compile = lambda device="auto": True  # as on a CUDA host
out = {"cached_before": triton_key.cache_info().currsize}
out["started"] = prefetch.start()
out["started_again"] = prefetch.start()  # once per process
out["took"] = prefetch.wait()
after = triton_key.cache_info()
out["cached_after"], out["misses_after"] = after.currsize, after.misses
key = triton_key()  # the first compile's call
out["hits_then"] = triton_key.cache_info().hits
out["key_is_the_version_and_hashes"] = key.startswith(__import__("triton").__version__)
print(json.dumps(out))
"""


def test_the_thread_hashes_the_key_once_and_the_next_call_finds_it():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cached_before"] == 0
    assert (out["started"], out["started_again"]) == (True, False)
    assert out["took"] > 0
    assert (out["cached_after"], out["misses_after"]) == (1, 1)  # computed once, by the thread
    assert out["hits_then"] == 1  # and not again by the main thread
    assert out["key_is_the_version_and_hashes"]


def test_nothing_starts_where_the_run_compiles_nothing(monkeypatch):
    assert not triton_key_prefetch.will_compile("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not triton_key_prefetch.will_compile("cuda")
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert not triton_key_prefetch.will_compile("auto")
    assert not triton_key_prefetch.start("auto")
    assert triton_key_prefetch.wait() is None  # no thread: at once


def test_start_up_joins_the_thread_before_its_first_launch(monkeypatch):
    from mrv2_prof.runner.worker import startup

    events = []
    monkeypatch.setattr(triton_key_prefetch, "wait", lambda: events.append("wait") or 0.25)
    for name in ("initialize_kv_cache", "warm_up"):  # the profiling run, the warm-up's launches
        real = getattr(startup, name)
        monkeypatch.setattr(
            startup, name, lambda *a, _n=name, _f=real, **k: (events.append(_n), _f(*a, **k))[1]
        )
    cfg = RunnerConfig(device="cpu", num_kv_blocks=64, max_model_len=256, cudagraph_mode="none")
    engine = Engine(cfg, ModelSpec(preset="llama-tiny"))
    assert events == ["wait", "initialize_kv_cache", "warm_up"]
    assert engine.info.triton_key_s == 0.25  # what the thread took, as wait returned it
    assert 0 <= engine.info.triton_key_wait_s < 1.0


def test_a_run_records_no_thread_on_the_cpu(run_in_process):
    """On the CPU nothing is hashed on a thread: the start-up facts say so (None), and the
    wait before the first launch is nil."""
    _, messages = run_in_process()
    facts = messages[-1][1].facts
    assert facts["triton_key_s"] is None and 0 <= facts["triton_key_wait_s"] < 0.01
