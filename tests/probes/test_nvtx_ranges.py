"""NVTX ranges, intercepted: every recorded span is also a push/pop in domain ``mrv2`` with the
right name, category and step payload, properly nested; each step ends with its batch-shape
mark; a run starts with the alignment mark stored in ``runs.info``. Without an NVTX tool the
probe records exactly what the plain recording probe records."""

from __future__ import annotations

import json
from types import SimpleNamespace

import duckdb
import pytest

from mrv2_prof.probes import nvtx_ranges
from mrv2_prof.probes.api import PHASES
from mrv2_prof.probes.nvtx_ranges import (
    CATEGORIES,
    NVTX_NAMES,
    NvtxRecordingProbe,
    batch_shape,
    get_domain,
)
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine


class FakeDomain:
    """Records the NVTX calls; attributes are plain mutable objects like nvtx's."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.categories: dict[str, int] = {}

    def get_category_id(self, name: str) -> int:
        return self.categories.setdefault(name, len(self.categories) + 1)

    def get_event_attributes(self, message=None, color=None, category=None, payload=None):
        return SimpleNamespace(message=message, category=category, payload=payload)

    def push_range(self, attributes) -> None:
        self.calls.append(("push", attributes.message, attributes.category, attributes.payload))

    def pop_range(self) -> None:
        self.calls.append(("pop",))

    def mark(self, attributes=None, *, message=None, payload=None, **_) -> None:
        self.calls.append(("mark", message, payload))


def run_engine(probe, async_scheduling=False) -> Engine:
    config = RunnerConfig(
        device="cpu", num_kv_blocks=64, max_num_batched_tokens=24, max_num_seqs=4,
        max_model_len=128, async_scheduling=async_scheduling,
        kernels="torch", uva=False, cudagraph_mode="none",
    )  # fmt: skip
    engine = Engine(config, ModelSpec(), probe)
    prompts = {f"r{i}": list(range(3 + i, 20 + 3 * i)) for i in range(4)}
    for i, (rid, ids) in enumerate(prompts.items()):
        engine.add_request(rid, ids, SamplingParams(max_tokens=5), arrival_time=float(i))
    while engine.has_unfinished_requests():
        engine.step()
    return engine


def ranges(calls: list[tuple]) -> list[tuple[str, int, int]]:
    """(message, category, payload) of each push, in order of its pop; nesting checked."""
    stack, closed = [], []
    for call in calls:
        if call[0] == "push":
            stack.append(call[1:])
        elif call[0] == "pop":
            assert stack, "pop without push"
            closed.append(stack.pop())
    assert stack == [], "unclosed ranges"
    return closed


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_every_span_is_an_nvtx_range_with_name_category_and_step(async_scheduling):
    domain = FakeDomain()
    probe = NvtxRecordingProbe(domain)
    assert probe.active
    run_engine(probe, async_scheduling)
    spans = probe.drain()["spans"]
    # spans are recorded at their end, like pops: the two sequences must agree one to one
    want = [
        (NVTX_NAMES[name], domain.categories[CATEGORIES[name]], step)
        for name, step in zip(spans["name"], spans["step"], strict=True)
    ]
    assert ranges(domain.calls) == want
    assert {name for name in spans["name"]} >= {"step", "schedule", "prepare", "forward"}
    assert NVTX_NAMES["prepare"] == "gpu_model_runner: preprocess"  # vLLM's filter names
    assert NVTX_NAMES["forward"] == "gpu_model_runner: forward"


def test_each_step_ends_with_its_batch_shape_mark():
    domain = FakeDomain()
    probe = NvtxRecordingProbe(domain)
    run_engine(probe)
    steps = probe.drain()["steps"]
    marks = [c for c in domain.calls if c[0] == "mark"]
    want = [
        ("mark", batch_shape(r, t, p, m), s)
        for s, r, t, p, m in zip(
            steps["step"], steps["num_reqs"], steps["num_tokens"],
            steps["num_prefill_tokens"], steps["graph_mode"], strict=True,
        )
    ]  # fmt: skip
    assert marks == want
    assert batch_shape(3, 40, 38, "none") == "batch 3 reqs: 38 prefill + 2 decode tokens, none"
    # the mark sits inside the step range: right before the step's pop
    first_mark = domain.calls.index(marks[0])
    assert domain.calls[first_mark + 1] == ("pop",)


def test_without_a_tool_attached_nothing_is_emitted_and_records_are_unchanged():
    real = get_domain()  # no nsys here: the nvtx package's dummy domain
    quiet = NvtxRecordingProbe(real)
    assert not quiet.active
    # the hooks are the recording probe's own: no frame of this class on the step loop
    for hook in ("step_begin", "begin", "end"):
        assert getattr(quiet, hook).__func__ is getattr(RecordingProbe, hook), hook
    plain = RecordingProbe()
    run_engine(quiet)
    run_engine(plain)
    a, b = quiet.drain(), plain.drain()
    assert list(a["spans"]["name"]) == list(b["spans"]["name"])
    assert list(a["steps"]["num_tokens"]) == list(b["steps"]["num_tokens"])


def test_a_run_starts_with_the_alignment_mark(run_in_process, monkeypatch):
    domain = FakeDomain()
    monkeypatch.setattr(nvtx_ranges, "get_domain", lambda name="mrv2": domain)
    job, _ = run_in_process("probes.nvtx=true", "workload.num_requests=2")
    with duckdb.connect(job.db_path, read_only=True) as con:
        run_id, info = con.execute("SELECT run_id, info FROM runs").fetchone()
        (first_step_ns,) = con.execute("SELECT min(cpu_start_ns) FROM steps").fetchone()
    info = json.loads(info)
    start = domain.calls[0]
    assert start == ("mark", f"mrv2 run {run_id} perf_counter_ns={start[2]}", start[2])
    assert info["nvtx_anchor_ns"] == start[2] < first_step_ns
    assert not any(n.startswith("probes.nvtx") for n in info["notes"])
    assert len(ranges(domain.calls)) > 0 and len(PHASES) == len(NVTX_NAMES)


def test_a_disabled_nvtx_probe_emits_nothing(run_in_process, monkeypatch):
    domain = FakeDomain()
    monkeypatch.setattr(nvtx_ranges, "get_domain", lambda name="mrv2": domain)
    job, _ = run_in_process("probes.nvtx=false", "workload.num_requests=2")
    with duckdb.connect(job.db_path, read_only=True) as con:
        info = json.loads(con.execute("SELECT info FROM runs").fetchone()[0])
        (spans,) = con.execute("SELECT count(*) FROM spans").fetchone()
    assert domain.calls == [] and "nvtx_anchor_ns" not in info
    assert spans > 0  # the CPU spans are recorded regardless
