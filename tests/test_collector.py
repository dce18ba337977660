"""The garbage collector around start-up (``pipeline.collector``), in a fresh interpreter each
(freezing is process-wide): no collection inside ``imports_uncollected``, what it made frozen
after it (a cycle made there kept for good), a cycle made after it freed by ``freeze_start_up``,
the collector left as it was found; and a run records the objects it froze."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mrv2_prof.pipeline.collector import ENV

SCRIPT = r"""
import gc, json, weakref
from mrv2_prof.pipeline.collector import freeze_start_up, imports_uncollected

class Node:
    pass

out = {}
if {disabled}:
    gc.disable()
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info))
before = gc.get_freeze_count()
with imports_uncollected("{module}"):
    out["enabled_inside"] = gc.isenabled()
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle, garbage once the names go
    cycle = weakref.ref(a)
    del a, b
    kept = [[i] for i in range(50_000)]  # enough allocations for many collections, were it on
    out["collections_inside"] = len(collections)
out["enabled_after"] = gc.isenabled()
out["frozen_grew_by"] = gc.get_freeze_count() - before
gc.collect()  # walks nothing frozen: the cycle stays
out["cycle_after_collect"] = cycle() is not None
c, d = Node(), Node()
c.other, d.other = d, c  # the engine's build: made after the imports, not frozen yet
later = weakref.ref(c)
del c, d
out["frozen_after_start_up"] = freeze_start_up()
out["cycle_after_start_up"] = cycle() is not None
out["later_cycle_after_start_up"] = later() is not None
out["all_frozen"] = gc.get_freeze_count() == out["frozen_after_start_up"] > len(kept)
print(json.dumps(out))
"""


def _run(disabled: bool, module: str = "not.imported.yet", env: dict | None = None) -> dict:
    code = SCRIPT.replace("{disabled}", str(disabled)).replace("{module}", module)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, ENV: "", **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_imports_made_uncollected_are_frozen_and_their_cycles_freed_after_start_up():
    out = _run(disabled=False)
    assert out["enabled_inside"] is False and out["collections_inside"] == 0
    assert out["enabled_after"] is True
    assert out["frozen_grew_by"] >= 50_000  # the lists made inside, and everything before
    assert out["cycle_after_collect"] is True  # frozen: no collection walks it
    assert out["cycle_after_start_up"] is True  # nor start-up's
    assert out["later_cycle_after_start_up"] is False  # what start-up made since: collected
    assert out["all_frozen"] is True


def test_a_collector_switched_off_before_stays_off():
    out = _run(disabled=True)
    assert out["enabled_inside"] is False and out["enabled_after"] is False
    assert out["later_cycle_after_start_up"] is False  # gc.collect runs, enabled or not


def test_a_module_imported_already_changes_nothing():
    """A process that imported it before (the tests run runners in their own process): the
    collector stays on and nothing is frozen, so garbage the process holds is still freed."""
    out = _run(disabled=False, module="json")
    assert out["enabled_inside"] is True and out["collections_inside"] > 0
    assert out["frozen_grew_by"] == 0
    assert out["cycle_after_collect"] is False  # the cycle made in the block: collected


def test_the_benchmarks_switch_leaves_the_collector_on_as_before():
    """``MRV2_PROF_START_UP_COLLECTOR=on`` (``benchmarks/startup.py --collector on``): the
    imports collected as they go, nothing frozen until start-up's one full collection."""
    out = _run(disabled=False, env={ENV: "on"})
    assert out["enabled_inside"] is True and out["collections_inside"] > 0
    assert out["frozen_grew_by"] == 0
    assert out["cycle_after_collect"] is False and out["all_frozen"] is True


def test_a_run_records_the_objects_it_froze(run_in_process):
    job, messages = run_in_process()
    frozen = messages[-1][1].facts["gc_frozen_objects"]
    assert isinstance(frozen, int) and frozen > 10_000  # torch's objects at least


def test_an_in_process_run_leaves_nothing_frozen_and_its_engine_collected(
    run_in_process, monkeypatch
):
    """A run in the caller's process (no runner process to exit) gives what start-up froze
    back to the collector and collects it: an engine in a reference cycle, frozen at start-up,
    is gone after the run (it held the KV cache and graph pools of a GPU test process)."""
    import gc
    import weakref

    from mrv2_prof.runner import engine as engine_module

    engines = []
    init = engine_module.Engine.__init__

    def tracked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.test_cycle = self  # only a collection frees it
        engines.append(weakref.ref(self))

    monkeypatch.setattr(engine_module.Engine, "__init__", tracked)
    job, messages = run_in_process()
    assert messages[-1][1].status == "completed"
    assert messages[-1][1].facts["gc_frozen_objects"] > 10_000  # start-up did freeze
    assert len(engines) == 1 and engines[0]() is None  # collected with the run
    assert gc.get_freeze_count() == 0


def test_the_start_up_benchmark_times_both_sides_in_one_invocation(tmp_path):
    """``benchmarks/startup.py --collector off on`` on the CPU: one run per side, and the sides
    differ as the switch says: with the imports frozen uncollected, more objects end frozen
    (the ones a collection would have untracked or freed) than after one full collection."""
    from tests.benchmark_runs import run_benchmark

    run = run_benchmark(
        "startup.py", tmp_path / "s.json", "--presets", "llama-tiny", "--set",
        "runner.device=cpu", "--repeats", "1", "--requests", "2", "--collector", "off", "on",
        timeout=300,
    )  # fmt: skip
    off, on = run.results
    assert (off["side"], on["side"]) == ("off", "on")
    assert off["to_first_step_s"] > 0 and on["to_first_step_s"] > 0
    assert off["gc_frozen_objects"] > on["gc_frozen_objects"] > 10_000
    assert "llama-tiny collector on: median" in run.stdout
