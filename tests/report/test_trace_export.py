"""Trace export: a valid Chrome trace that Perfetto imports as intended, and that round-trips.

The fixture run is hand-built (GPU spans, kernels and NVML samples exist only on GPU runs); the
expected values below are written out from the fixture's table, not taken from the exporter.
"""

from __future__ import annotations

import io
import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from mrv2_prof.probes.nvtx_ranges import NVTX_NAMES
from mrv2_prof.report.chrome_trace import Slice, laminar, us
from mrv2_prof.report.trace_export import export_trace, parse_steps
from mrv2_prof.store import Store

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN, STARTED_NS, ANCHOR_NS = "abc123", 1_000_000, 1_500_000
BASE_NS = {0: 2_000_001, 1: 3_000_004, 2: 4_000_007}  # each step's CPU start
CPU_PHASES = [  # (phase, start offset, end offset) from the step's start
    ("step", 0, 900_000),
    ("schedule", 10_000, 100_000),
    ("execute", 100_000, 600_000),
    ("prepare", 110_000, 200_000),
    ("forward", 200_000, 500_000),
    ("sample", 500_000, 600_000),  # ends where execute ends
    ("output_wait", 700_000, 800_000),
    ("update", 800_000, 900_000),  # ends where step ends
]
FLUSH = (1, 3_950_000, 3_990_000)  # after step 1, outside its step range
GPU_PHASES = [("prepare", 300_000, 350_000), ("forward", 350_000, 800_000)]
GPU_PHASES += [("sample", 800_000, 850_123)]
GPU_STEPS = (0, 1)  # step 2 ran nothing on the GPU
KERNELS = [  # step, phase, name, start, end, stream
    (0, "forward", "gemm_kernel", 2_360_001, 2_400_001, 7),
    (0, "forward", "rmsnorm_kernel", 2_400_001, 2_410_001, 7),
    (1, "sample", "sampler_kernel", 3_810_004, 3_840_004, 9),
]
SAMPLES = [  # t_ns, gpu_util, mem_used_bytes, power_w, sm_clock_mhz
    (1_900_000, 0.0, 1 << 30, 60.0, 1410.0),
    (2_500_000, 87.5, 3 << 30, 250.5, 1980.0),
    (3_500_000, 90.0, 3 << 30, None, 1980.0),
    (4_500_000, 5.0, 3 << 30, 80.0, 1410.0),
]
KV_USED, RUNNING, WAITING = [10, 12, 15], [2, 3, 2], [1, 0, 0]
COUNTER_NAMES = {"kv_used_blocks", "num_running", "num_waiting"}
COUNTER_NAMES |= {"gpu_util", "mem_used_bytes", "power_w", "sm_clock_mhz"}
METADATA_NAMES = {"process_name", "thread_name", "process_sort_index"}
ANCHOR_MARK = f"mrv2 run {RUN} perf_counter_ns={ANCHOR_NS}"


def build_fixture_db(path: Path) -> Path:
    with Store.open(path) as store:
        store.begin_run(
            RUN,
            scenario_name="decode-heavy",
            label="decode-heavy",
            matrix_combo=None,
            scenario_yaml="name: decode-heavy\n",
            device="cuda:0",
            versions={"mrv2_prof": "0.1.0"},
            started_ns=STARTED_NS,
            info={"nvtx_anchor_ns": ANCHOR_NS, "dtype": "bfloat16"},
        )
        spans = [
            (s, "cpu", p, b + lo, b + hi) for s, b in BASE_NS.items() for p, lo, hi in CPU_PHASES
        ]
        spans.append((FLUSH[0], "cpu", "flush", FLUSH[1], FLUSH[2]))
        spans += [
            (s, "gpu", p, BASE_NS[s] + lo, BASE_NS[s] + hi)
            for s in GPU_STEPS
            for p, lo, hi in GPU_PHASES
        ]
        store.append(
            RUN,
            "spans",
            dict(
                zip(
                    ["step", "track", "name", "start_ns", "end_ns"],
                    zip(*spans, strict=True),
                    strict=True,
                )
            ),
        )
        steps = sorted(BASE_NS)
        gpu = {s: (BASE_NS[s] + 300_000, BASE_NS[s] + 850_123) for s in GPU_STEPS}
        store.append(
            RUN,
            "steps",
            {
                "step": steps,
                "cpu_start_ns": [BASE_NS[s] for s in steps],
                "cpu_end_ns": [BASE_NS[s] + 900_000 for s in steps],
                "gpu_start_ns": [gpu[s][0] if s in gpu else None for s in steps],
                "gpu_end_ns": [gpu[s][1] if s in gpu else None for s in steps],
                "num_reqs": [3, 3, 2],
                "num_tokens": [40, 3, 2],
                "num_prefill_tokens": [37, 0, 0],
                "num_decode_tokens": [3, 3, 2],
                "graph_mode": ["none", "full", "full"],
                "overlap_frac": [None, 0.25, None],
                "bubble_ns": [None, 450_000, None],
                "kv_used_blocks": KV_USED,
                "num_running": RUNNING,
                "num_waiting": WAITING,
            },
        )
        cols = ["step", "phase", "name", "start_ns", "end_ns", "stream"]
        store.append(RUN, "kernels", dict(zip(cols, zip(*KERNELS, strict=True), strict=True)))
        cols = ["t_ns", "gpu_util", "mem_used_bytes", "power_w", "sm_clock_mhz"]
        store.append(RUN, "gpu_samples", dict(zip(cols, zip(*SAMPLES, strict=True), strict=True)))
        store.finish_run(RUN, "completed", ended_ns=5_000_000)
    return path


@pytest.fixture
def fixture_db(tmp_path: Path) -> Path:
    return build_fixture_db(tmp_path / "runs.duckdb")


def export_doc(db: Path, run_id: str = RUN, steps: str | None = None) -> dict:
    buf = io.StringIO()
    with Store.open(db, read_only=True) as store:
        export_trace(store, run_id, buf, None if steps is None else parse_steps(steps))
    return json.loads(buf.getvalue())


def perfetto_ns(us_value: float) -> int:
    """What Perfetto's JSON importer makes of a µs real: int64(x * 1000.0), truncated."""
    return int(us_value * 1000.0)


def validate(doc: dict) -> None:
    """A valid Chrome trace as Perfetto imports it (see the checks' messages)."""
    assert {"traceEvents", "displayTimeUnit", "otherData"} <= set(doc)
    assert doc["displayTimeUnit"] == "ns"
    last_ts: dict[tuple, float] = {}
    open_b: dict[tuple, list] = defaultdict(list)
    slices: dict[tuple, list] = defaultdict(list)
    flows_out, flows_in = {}, {}
    nvtx = set(NVTX_NAMES.values())
    for e in doc["traceEvents"]:
        ph, name = e["ph"], e["name"]
        if ph == "M":
            assert name in METADATA_NAMES, name
            continue
        track = (e["pid"], e["tid"])
        ts = e["ts"]
        assert ts >= 0 and ts >= last_ts.get(track, -math.inf), f"not monotonic on {track}: {e}"
        last_ts[track] = ts
        if ph == "X":
            assert e["dur"] >= 0, e
            start = perfetto_ns(ts)
            slices[track].append((start, start + perfetto_ns(e["dur"]), e))
        elif ph == "B":
            open_b[track].append(name)
        elif ph == "E":
            assert open_b[track] and open_b[track].pop() == name, f"unbalanced E {e}"
        else:
            assert ph in ("C", "i"), f"unexpected phase {ph}"
        if e.get("cat") == "cuda_kernel":
            assert ph == "X" and name  # documented extra: CUDA's kernel names
        elif e.get("cat") == "request":  # documented extra: a request's slice, on its lane
            assert ph == "X" and name == f"request {e['args']['req_id']}", e
        elif ph == "C":
            assert name in COUNTER_NAMES and set(e["args"]) == {"value"}, e
        elif ph == "i":
            assert name.startswith("mrv2 run ") and " perf_counter_ns=" in name, name
        else:
            assert name in nvtx, f"not an NVTX range name: {name!r}"
        if "bind_id" in e:
            assert ph == "X" and e.get("flow_out") != e.get("flow_in"), e
            side = flows_out if e.get("flow_out") else flows_in
            assert e["bind_id"] not in side, f"flow id {e['bind_id']} bound twice"
            side[e["bind_id"]] = e
    assert not any(open_b.values()), f"unclosed B events: {dict(open_b)}"
    assert set(flows_out) == set(flows_in), "every flow needs a start and an end slice"
    for track, items in slices.items():  # nested or disjoint, as Perfetto's slice stack needs
        stack: list[tuple[int, int, dict]] = []
        for start, end, e in sorted(items, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1][1], f"{e} crosses {stack[-1][2]} on {track}"
            stack.append((start, end, e))


def x_events(doc: dict, pid: int, name: str | None = None) -> list[dict]:
    return [
        e for e in doc["traceEvents"]
        if e["ph"] == "X" and e["pid"] == pid and (name is None or e["name"] == name)
    ]  # fmt: skip


def span_ns(doc: dict, e: dict) -> tuple[int, int]:
    """Absolute perf_counter_ns of a slice, recovered as a reader of the trace would."""
    origin = doc["otherData"]["origin_ns"]
    start = origin + round(e["ts"] * 1000)
    return start, start + round(e["dur"] * 1000)


def names(doc: dict, kind: str) -> dict[tuple, str]:
    return {
        (e["pid"], e.get("tid")): e["args"]["name"]
        for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == kind
    }  # fmt: skip


def counter(doc: dict, name: str) -> list[tuple[int, float]]:
    origin = doc["otherData"]["origin_ns"]
    return [
        (origin + round(e["ts"] * 1000), e["args"]["value"])
        for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == name
    ]  # fmt: skip


def _mutate(doc: dict, how: str) -> None:
    events = doc["traceEvents"]
    xs = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    if how == "negative dur":
        xs[3]["dur"] = -1.0
    elif how == "backwards ts":
        xs[-1]["ts"] = xs[0]["ts"] - 1.0
    elif how == "crossing":
        xs[1]["dur"] = xs[0]["dur"]  # schedule now ends after its step
    elif how == "dangling flow":
        next(e for e in events if e.get("flow_in")).pop("bind_id")
    elif how == "unknown name":
        xs[2]["name"] = "execute"
    elif how == "unbalanced B":
        events.append({"ph": "B", "name": "step", "pid": 1, "tid": 1, "ts": 1e9})


@pytest.mark.parametrize(
    "how",
    ["negative dur", "backwards ts", "crossing", "dangling flow", "unknown name", "unbalanced B"],
)
def test_validator_rejects_broken_traces(fixture_db: Path, how: str) -> None:
    doc = export_doc(fixture_db)
    validate(doc)
    _mutate(doc, how)
    with pytest.raises(AssertionError):
        validate(doc)


def test_fixture_trace_is_valid_and_round_trips_the_step_ranges(fixture_db: Path) -> None:
    doc = export_doc(fixture_db)
    validate(doc)
    steps = {e["args"]["step"]: span_ns(doc, e) for e in x_events(doc, 1, "step")}
    assert steps == {s: (b, b + 900_000) for s, b in BASE_NS.items()}
    step0 = next(e for e in x_events(doc, 1, "step") if e["args"]["step"] == 0)
    assert step0["args"]["payload"] == 0 and step0["args"]["num_reqs"] == 3
    assert step0["args"]["batch"] == "batch 3 reqs: 37 prefill + 3 decode tokens, none"
    assert step0["args"]["graph_mode"] == "none" and step0["args"]["num_prefill_tokens"] == 37
    # every CPU span under its NVTX name, payload = step
    cpu = sorted((e["args"]["step"], e["name"], span_ns(doc, e)) for e in x_events(doc, 1))
    expected = [
        (s, NVTX_NAMES[p], (b + lo, b + hi)) for s, b in BASE_NS.items() for p, lo, hi in CPU_PHASES
    ]
    expected.append((1, "harness: flush", (FLUSH[1], FLUSH[2])))
    assert cpu == sorted(expected)
    assert all(e["args"]["payload"] == e["args"]["step"] for e in x_events(doc, 1))
    other = doc["otherData"]
    assert other["origin_ns"] == STARTED_NS and other["run_id"] == RUN
    assert other["nvtx_anchor_ns"] == ANCHOR_NS and other["nvtx_anchor_mark"] == ANCHOR_MARK
    assert ANCHOR_MARK in other["align_with_nsys"]
    assert other["gpu_timeline"] is True and other["kernel_trace"] is True
    assert other["num_events"] == len(doc["traceEvents"])
    [mark] = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert mark["name"] == ANCHOR_MARK and mark["ts"] == 500.0 and mark["pid"] == 1


def test_gpu_track_flows_kernels_and_counters(fixture_db: Path) -> None:
    doc = export_doc(fixture_db)
    assert names(doc, "process_name") == {(1, 1): "mrv2-prof runner (CPU)", (2, 1): "GPU"}
    threads = names(doc, "thread_name")
    assert threads[(1, 1)] == "phases" and threads[(2, 1)] == "compute stream (phase spans)"
    gpu_steps = {e["args"]["step"]: span_ns(doc, e) for e in x_events(doc, 2, "step")}
    assert gpu_steps == {s: (BASE_NS[s] + 300_000, BASE_NS[s] + 850_123) for s in GPU_STEPS}
    gpu = sorted(
        (e["args"]["step"], e["name"], span_ns(doc, e))
        for e in x_events(doc, 2)
        if e["cat"] == "mrv2"
    )
    expected = [
        (s, NVTX_NAMES[p], (BASE_NS[s] + lo, BASE_NS[s] + hi))
        for s in GPU_STEPS
        for p, lo, hi in GPU_PHASES
    ]
    expected += [(s, "step", gpu_steps[s]) for s in GPU_STEPS]
    assert gpu == sorted(expected)
    step1 = next(e for e in x_events(doc, 2, "step") if e["args"]["step"] == 1)
    assert step1["args"]["overlap_frac"] == 0.25 and step1["args"]["bubble_ns"] == 450_000

    # one arrow per step with GPU work: its CPU execute -> its first GPU span (preprocess)
    outs = {e["args"]["step"]: e for e in x_events(doc, 1) if e.get("flow_out")}
    ins = {e["args"]["step"]: e for e in x_events(doc, 2) if e.get("flow_in")}
    assert set(outs) == set(ins) == set(GPU_STEPS)
    for s in GPU_STEPS:
        assert outs[s]["bind_id"] == ins[s]["bind_id"]
        assert outs[s]["name"] == "gpu_model_runner: execute_model"
        assert ins[s]["name"] == "gpu_model_runner: preprocess"
        assert span_ns(doc, ins[s])[0] == BASE_NS[s] + 300_000

    kernel_tracks = {t: n for t, n in threads.items() if n.endswith("kernels")}
    assert sorted(kernel_tracks.values()) == ["stream 7 kernels", "stream 9 kernels"]
    by_stream = defaultdict(list)
    for e in doc["traceEvents"]:
        if e.get("cat") == "cuda_kernel":
            by_stream[threads[(e["pid"], e["tid"])]].append((e["name"], span_ns(doc, e)))
    assert by_stream == {
        "stream 7 kernels": [
            ("gemm_kernel", (2_360_001, 2_400_001)),
            ("rmsnorm_kernel", (2_400_001, 2_410_001)),
        ],
        "stream 9 kernels": [("sampler_kernel", (3_810_004, 3_840_004))],
    }

    assert counter(doc, "gpu_util") == [(t, u) for t, u, *_ in SAMPLES]
    assert counter(doc, "power_w") == [(1_900_000, 60.0), (2_500_000, 250.5), (4_500_000, 80.0)]
    assert counter(doc, "kv_used_blocks") == [(BASE_NS[s], KV_USED[s]) for s in sorted(BASE_NS)]
    assert counter(doc, "num_waiting") == [(BASE_NS[s], WAITING[s]) for s in sorted(BASE_NS)]


@pytest.mark.parametrize(
    ("spec", "window"),
    [("1:2", [1]), ("-1:", [2]), (":2", [0, 1]), (":", [0, 1, 2]), ("1:99", [1, 2])],
)
def test_steps_window_is_a_python_slice(fixture_db: Path, spec: str, window: list[int]) -> None:
    doc = export_doc(fixture_db, steps=spec)
    validate(doc)
    assert doc["otherData"]["steps"] == {"first": window[0], "last": window[-1]}
    assert sorted(e["args"]["step"] for e in x_events(doc, 1, "step")) == window
    assert {e["args"]["step"] for e in x_events(doc, 1)} == set(window)
    gpu = {e["args"]["step"] for e in x_events(doc, 2) if e["cat"] == "mrv2"}
    assert gpu == set(window) & set(GPU_STEPS)
    flows = {e["args"]["step"] for e in x_events(doc, 1) if e.get("flow_out")}
    assert flows == set(window) & set(GPU_STEPS)
    kernels = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "cuda_kernel"}
    assert kernels == {k[2] for k in KERNELS if k[0] in window}
    assert counter(doc, "kv_used_blocks") == [(BASE_NS[s], KV_USED[s]) for s in window]


def test_window_keeps_samples_inside_its_steps(fixture_db: Path) -> None:
    doc = export_doc(fixture_db, steps="1:2")  # step 1: 3_000_004 .. flush end 3_990_000
    assert counter(doc, "gpu_util") == [(3_500_000, 90.0)]
    assert doc["otherData"]["origin_ns"] == STARTED_NS  # same origin as the whole-run trace


def test_quickstart_cpu_run_has_no_gpu_track(run_in_process, tmp_path: Path) -> None:
    run_in_process()
    db = tmp_path / "runs.duckdb"
    with Store.open(db, read_only=True) as store:
        run_id = store.resolve_run("latest")
        step_spans = dict(
            (s, (a, b))
            for s, a, b in store.connection.execute(
                "SELECT step, start_ns, end_ns FROM spans WHERE run_id = ? AND track = 'cpu' "
                "AND name = 'step'",
                [run_id],
            ).fetchall()
        )
    doc = export_doc(db, run_id)
    validate(doc)
    assert {e["pid"] for e in doc["traceEvents"]} == {1, 3}  # the CPU track and the requests
    assert doc["otherData"]["gpu_timeline"] is False
    assert any(n.startswith("no GPU timeline") for n in doc["otherData"]["notes"])
    recovered = {e["args"]["step"]: span_ns(doc, e) for e in x_events(doc, 1, "step")}
    assert step_spans and set(recovered) == set(step_spans)
    for step, (start, end) in step_spans.items():
        assert abs(recovered[step][0] - start) <= 1000 and abs(recovered[step][1] - end) <= 1000
    assert not any("bind_id" in e for e in doc["traceEvents"])  # nothing on a GPU to point at


class RecordingDomain:
    """An NVTX domain that records pushes and marks (what nsys would show)."""

    def __init__(self) -> None:
        self.pushed: list[tuple[str, int]] = []
        self.marks: list[str] = []

    def get_category_id(self, name: str) -> int:
        return 1

    def get_event_attributes(self, message=None, color=None, category=None, payload=None):
        return SimpleNamespace(message=message, payload=payload)

    def push_range(self, attributes) -> None:
        self.pushed.append((attributes.message, attributes.payload))

    def pop_range(self) -> None:
        pass

    def mark(self, attributes=None, *, message=None, payload=None, **_) -> None:
        self.marks.append(message)


def test_ranges_and_anchor_match_what_nvtx_emitted(run_in_process, tmp_path, monkeypatch) -> None:
    from mrv2_prof.probes import nvtx_ranges

    domain = RecordingDomain()
    monkeypatch.setattr(nvtx_ranges, "get_domain", lambda name="mrv2": domain)
    run_in_process("probes.nvtx=true", "workload.num_requests=3")
    with Store.open(tmp_path / "runs.duckdb", read_only=True) as store:
        run_id = store.resolve_run("latest")
    doc = export_doc(tmp_path / "runs.duckdb", run_id)
    validate(doc)
    [mark] = [e["name"] for e in doc["traceEvents"] if e["ph"] == "i"]
    assert mark == domain.marks[0] == doc["otherData"]["nvtx_anchor_mark"]
    exported = Counter((e["name"], e["args"]["payload"]) for e in x_events(doc, 1))
    pushed = Counter(domain.pushed)
    steps = [r for r in pushed if r[0] == "step"]
    assert steps and all(exported[r] == pushed[r] for r in steps)
    assert not exported - pushed  # every exported range is one NVTX pushed, same name and payload


def test_us_reads_back_exactly_under_perfettos_truncation() -> None:
    for ns in [*range(0, 20_000, 7), 1_001, 999_999_999, 10**12 + 1, 5 * 10**14 + 3]:
        value = us(ns)
        assert int(value * 1000.0) == ns and round(value * 1000) == ns
        assert abs(value - ns / 1000) < 1e-6 * max(1.0, ns / 1000)


def test_laminar_clips_a_crossing_slice_and_keeps_nesting() -> None:
    def item(start: int, end: int, name: str) -> Slice:
        return Slice(start, end, {"name": name, "pid": 1, "tid": 1})

    events = list(
        laminar(
            [
                item(0, 1000, "a"),
                item(100, 200, "a.child"),
                item(500, 1500, "b"),
                item(2000, 2100, "c"),
            ]
        )
    )
    got = {e["name"]: (perfetto_ns(e["ts"]), perfetto_ns(e["dur"])) for e in events}
    assert got == {"a": (0, 500), "a.child": (100, 100), "b": (500, 1000), "c": (2000, 100)}
    assert events[0]["args"] == {"clipped_ns": 500}
    assert [e["name"] for e in events] == ["a", "a.child", "b", "c"]
