"""The probe API: RecordingProbe's drained tables against a scripted sequence of hooks on a fake
clock, buffer growth, no allocation per event in steady state, the no-op Probe's signatures, and
an Engine run on the CPU whose drained tables are checked against the engine's own results."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from mrv2_prof.probes import api, recording
from mrv2_prof.probes.api import PHASES
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.store.schema import TABLES

HOOKS = (
    "step_begin",
    "step_end",
    "begin",
    "end",
    "switch",
    "staged_write",
    "graph_dispatch",
    "graph_capture",
    "sync",
    "rank_step",
    "before_wait",
    "gpu_mark",
    "copy",
    "request_arrival",
    "token",
    "step_tokens",
    "request_finish",
    "spec_step",
    "kernel_compile",
)
SITE = "mrv2_prof/runner/worker/async_output.py:AsyncOutput.wait"
COLUMNS = {
    "steps": [
        "step", "cpu_start_ns", "cpu_end_ns", "num_reqs", "num_tokens", "num_prefill_tokens",
        "num_decode_tokens", "num_waiting", "num_running", "kv_used_blocks", "num_preempted",
        "output_wait_ns", "graph_mode", "context_tokens", "attn_pairs", "spec_k",
        "num_draft_tokens", "num_accepted_tokens",
        "spec_reserved", "spec_reclaimed", "spec_sat_out", "spec_expected_tokens",
        "spec_cost_ratio",
    ],
    "spans": ["step", "track", "name", "start_ns", "end_ns", "starved_ns"],
    "staged_writes": ["step", "tensor", "rows", "elements", "staged_bytes", "dense_bytes"],
    "graph_dispatch": [
        "step", "num_tokens", "padded_tokens", "requested_mode", "mode", "hit", "reason",
    ],
    "syncs": ["step", "t_ns", "kind", "site", "blocked_ns"],
    "tokens": ["req_id", "idx", "t_ns", "token_id"],
    "requests": [
        "req_id", "arrival_ns", "first_token_ns", "finish_ns", "prompt_tokens", "output_tokens",
        "num_preemptions", "finish_reason", "cached_tokens",
    ],
    "graph_captures": ["key", "mode", "num_tokens", "capture_s", "mem_bytes", "step"],
    "copies": ["step", "direction", "bytes", "pinned", "contiguous", "non_blocking", "host_ns"],
    "rank_steps": ["rank", "step", "start_ns", "end_ns", "comm_ns"],
    "spec_verifies": ["step", "req_id", "num_draft_tokens", "num_accepted_tokens"],
    "compiles": ["step", "t_ns", "source", "kernel", "key", "compile_ms", "after_warmup"],
}  # fmt: skip


def col(tables, table: str, name: str) -> list:
    """A column as a list; NaN (a float column's "none given", stored NULL) as None."""
    return [None if v != v else v for v in tables[table][name].tolist()]


def rows(tables, table: str, names: list[str] | None = None) -> list[tuple]:
    names = COLUMNS[table] if names is None else names
    return list(zip(*(col(tables, table, n) for n in names), strict=True))


def num_rows(cols: dict[str, np.ndarray]) -> int:
    lengths = {len(v) for v in cols.values()}
    assert len(lengths) == 1, {k: len(v) for k, v in cols.items()}
    return lengths.pop()


# ---- a scripted sequence on a fake clock ---------------------------------------------------------
class FakeClock:
    """``perf_counter_ns`` stand-in: 1000, 1007, 1014, ...; ``last`` is the latest reading."""

    def __init__(self) -> None:
        self.last = 993

    def __call__(self) -> int:
        self.last += 7
        return self.last


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(recording, "perf_counter_ns", c)
    return c


# a step's spec-decode columns when ``spec_step`` was not called: no drafts, no decision (NULL)
NO_SPEC = (0, 0, 0, 0, 0, 0, None, None)


class Scripted:
    """Calls the probe's hooks as the runner does and keeps the rows each table must then hold
    (``rows`` order, without ``track``), timestamps taken from the fake clock's readings."""

    def __init__(self, probe: RecordingProbe, clock: FakeClock) -> None:
        self.p, self.clock, self.step = probe, clock, -1
        self.want: dict[str, list[tuple]] = {t: [] for t in COLUMNS}
        self.gpu_rows: list[int] = []  # indices of the spans with track 'gpu'
        self.spec = NO_SPEC  # the step's spec-decode columns (k, drafted, accepted, ...)

    def step_begin(self, step: int) -> None:
        self.p.step_begin(step)
        self.step, self.step_start = step, self.clock.last

    def step_end(self, num_reqs, num_tokens, num_prefill, *rest) -> None:
        self.p.step_end(num_reqs, num_tokens, num_prefill, *rest)
        num_decode = num_tokens - num_prefill
        counts = (num_reqs, num_tokens, num_prefill, num_decode, *rest, *self.spec)
        self.spec = NO_SPEC
        self.want["steps"].append((self.step, self.step_start, self.clock.last, *counts))
        self.want["spans"].append((self.step, "step", self.step_start, self.clock.last, -1))

    @contextmanager
    def phase(self, phase: int):
        self.p.begin(phase)
        start = self.clock.last
        yield
        self.p.end(phase)
        self.want["spans"].append((self.step, PHASES[phase], start, self.clock.last, -1))

    def staged_write(self, *args) -> None:
        self.p.staged_write(*args)
        self.want["staged_writes"].append((self.step, *args))

    def graph_dispatch(self, *args) -> None:
        self.p.graph_dispatch(*args)
        self.want["graph_dispatch"].append((self.step, *args))

    def sync(self, kind: str, site: str, blocked_ns: int, t_ns: int = -1) -> None:
        self.p.sync(kind, site, blocked_ns, t_ns)
        began_ns = self.clock.last - blocked_ns if t_ns < 0 else t_ns  # when the wait began
        self.want["syncs"].append((self.step, began_ns, kind, site, blocked_ns))

    def spec_step(self, k: int, drafted: int, verifies: list[tuple[str, int, int]], **kw) -> None:
        self.p.spec_step(k, drafted, verifies, **kw)
        accepted = sum(v[2] for v in verifies)
        names = ("reserved", "reclaimed", "sat_out", "expected_tokens", "cost_ratio")
        given = (kw.get(n, d) for n, d in zip(names, NO_SPEC[3:], strict=True))
        self.spec = (k, drafted, accepted, *given)
        self.want["spec_verifies"].extend((self.step, *v) for v in verifies)

    def kernel_compile(self, source: str, kernel: str, key: str, compile_ms: float) -> None:
        """Stored at the probe's step (-1 before the first), begun ``compile_ms`` before the
        reading after it; after warm-up once a step has begun."""
        self.p.kernel_compile(source, kernel, key, compile_ms)
        began_ns = self.clock.last - int(compile_ms * 1e6)
        row = (self.step, began_ns, source, kernel, key, compile_ms, self.step >= 0)
        self.want["compiles"].append(row)

    def token(self, *args) -> None:
        self.p.token(*args)
        self.want["tokens"].append(args)

    def copy(self, *args) -> None:
        self.p.copy(*args)
        self.want["copies"].append((self.step, *args))

    def gpu_span(self, step: int, gpu_phase: int, start_ns: int, end_ns: int, starved: int) -> None:
        """A resolved device span: stored with track 'gpu' under the phase's name, with its
        starved time (host spans have none: -1, stored NULL)."""
        self.p.gpu_span(step, gpu_phase, start_ns, end_ns, starved)
        name = ("prepare", "forward", "sample")[gpu_phase]
        self.want["spans"].append((step, name, start_ns, end_ns, starved))
        self.gpu_rows.append(len(self.want["spans"]) - 1)


def run_script(p: RecordingProbe, clock: FakeClock) -> Scripted:
    """Three steps of every hook; requests that finish, never get a token, never arrive, and one
    that never finishes."""
    s = Scripted(p, clock)
    p.request_arrival("a", 10, 5)
    p.request_arrival("b", 20, 3)
    p.request_arrival("c", 30, 4)  # never gets a token; finished without a reason or a time
    p.request_arrival("d", 40, 2)  # never finishes
    p.request_arrival("none", 50, 1)  # the same string as a graph mode: one intern table
    modes = ("none", "piecewise", "full")
    reasons = ("padded → 8", "captured: 8 tokens", "")
    s.kernel_compile("triton", "_advance_kernel", "int64@16, =1", 0.002)  # start-up: step -1
    for k in range(3):
        s.step_begin(10 + k)
        with s.phase(api.SCHEDULE):
            pass
        with s.phase(api.EXECUTE):
            with s.phase(api.PREPARE):
                s.staged_write("block_table", k + 1, 4 * k + 3, 12 * k + 40, 2048)
                if k == 0:
                    s.staged_write("prefill_token_ids", 2, 9, 100, 1 << 40)  # needs int64
                s.copy("h2d", 64 + k, True, True, True, 900 + k)
                if k == 2:
                    s.copy("d2h", 1 << 33, False, k != 2, True, 5_000)  # a flagged one
                if k == 1:  # a launcher's cache miss in a step: after warm-up
                    s.kernel_compile("triton", "_advance_kernel", "int64@16, %16", 0.005)
            s.graph_dispatch(5 + k, 8, "full", modes[k], k == 1, reasons[k])
            for phase in (api.FORWARD, api.SAMPLE, api.OUTPUT_WAIT):
                with s.phase(phase):
                    pass
            s.sync("output_wait", SITE, 3 + k)
        with s.phase(api.UPDATE):
            s.token("a", k, 5000 + k, 100 + k)
            if k >= 1:
                s.token("b", k - 1, 5000 + k, 200 + k)
            s.token("none", k, 5000 + k, 300 + k)
        if k == 1:  # speculative decoding's step record (none in the first step); a decision
            # without a measured cost, the other values left at their defaults
            s.spec_step(2, 3, [("a", 2, 1)], reserved=4, reclaimed=1, expected_tokens=2.0)
        if k == 2:
            s.spec_step(3, 6, [("a", 2, 2), ("b", 3, 0)], reserved=6, reclaimed=3, sat_out=2,
                        expected_tokens=1.75, cost_ratio=1.25)  # fmt: skip
        s.step_end(2 + k, 9 + k, 4, 3 - k, 2, 17 + k, k % 2, 11 * k, modes[k], 40 + k, 90 + k)
        if k >= 1:  # the previous step's device spans resolve a step late
            for g in range(3):
                s.gpu_span(9 + k, g, 100_000 * k + 10 * g, 100_000 * k + 10 * g + 9, g * 3)
    s.sync("item", "mrv2_prof/x.py:3", 100, t_ns=12345)  # an explicit time is kept
    s.want["rank_steps"] = [(0, 10, 7_000, 7_900, 300), (1, 10, 7_010, 7_950, 280 + (1 << 33))]
    for row in s.want["rank_steps"]:  # the tensor-parallel ranks' step rows, at the close
        p.rank_step(*row)
    p.graph_capture("full:8", "full", 8, 0.25, 1 << 33)
    p.graph_capture("piecewise:16", "piecewise", 16, 1.5, 0)  # as if captured on first use
    capture_step = p.step  # the step that was running (-1 before the first)
    assert capture_step >= 0
    p.request_finish("a", 6000, 3, 1, "length", 4)
    p.request_finish("b", 6001, 2, 0, "stop", 0)
    p.request_finish("c", -1, 0, 0, None, -1)
    p.request_finish("e", 6002, 0, 0, "abort", 0)  # never arrived
    p.request_finish("none", 6003, 3, 0, "length", 0)
    s.want["requests"] = [
        # req_id, arrival, first token, finish, prompt, output, preemptions, reason, cached
        ("a", 10, 5000, 6000, 5, 3, 1, "length", 4),
        ("b", 20, 5001, 6001, 3, 2, 0, "stop", 0),
        ("c", 30, -1, -1, 4, 0, 0, None, 0),  # cached -1 (never scheduled) is stored as 0
        ("e", -1, -1, 6002, 0, 0, 0, "abort", 0),
        ("none", 50, 5000, 6003, 1, 3, 0, "length", 0),
    ]
    s.want["graph_captures"] = [
        ("full:8", "full", 8, 0.25, 1 << 33, capture_step),
        ("piecewise:16", "piecewise", 16, 1.5, 0, capture_step),
    ]
    return s


def test_drain_returns_exactly_what_was_recorded(clock):
    p = RecordingProbe()
    s = run_script(p, clock)
    t = p.drain()

    assert set(t) == set(COLUMNS)
    for table, cols in t.items():
        assert list(cols) == COLUMNS[table], table
        assert set(cols) <= {name for name, _ in TABLES[table]} - {"run_id"}, table
        num_rows(cols)
    for table, want in s.want.items():
        names = [c for c in COLUMNS[table] if c != "track"]
        assert rows(t, table, names) == want, table
    tracks = ["gpu" if i in s.gpu_rows else "cpu" for i in range(len(s.want["spans"]))]
    assert col(t, "spans", "track") == tracks and tracks.count("gpu") == 6
    assert col(t, "steps", "graph_mode") == ["none", "piecewise", "full"]
    assert col(t, "steps", "num_decode_tokens") == [5, 6, 7]

    int64 = ["step", "cpu_start_ns", "output_wait_ns", "start_ns", "end_ns", "t_ns", "elements",
             "staged_bytes", "dense_bytes", "arrival_ns", "first_token_ns", "finish_ns",
             "mem_bytes", "bytes", "host_ns"]  # fmt: skip
    for table, cols in t.items():
        for name, values in cols.items():
            if name in int64:
                assert values.dtype == np.int64, (table, name)
            elif name in ("num_tokens", "num_reqs", "rows", "idx", "output_tokens"):
                assert values.dtype == np.int32, (table, name)
    assert t["graph_dispatch"]["hit"].dtype == np.bool_
    assert t["graph_captures"]["capture_s"].dtype == np.float64
    strings = [("steps", "graph_mode"), ("spans", "name"), ("spans", "track"),
               ("staged_writes", "tensor"), ("syncs", "site"), ("tokens", "req_id"),
               ("requests", "req_id"), ("requests", "finish_reason")]  # fmt: skip
    for table, name in strings:
        assert t[table][name].dtype == object, (table, name)
        assert all(v is None or type(v) is str for v in col(t, table, name)), (table, name)


def test_second_drain_is_empty_and_later_records_start_fresh(clock):
    p = RecordingProbe()
    run_script(p, clock)
    first = p.drain()
    kept = {table: {k: v.copy() for k, v in cols.items()} for table, cols in first.items()}
    second = p.drain()
    assert set(second) == set(COLUMNS) - {"graph_captures"}  # captures only when there are some
    for cols in second.values():
        assert num_rows(cols) == 0

    # "d" arrived before both drains: its arrival survives them, its first token comes after
    p.step_begin(13)
    start = clock.last
    p.token("d", 0, 7000, 42)
    p.token("d", 1, 7100, 43)
    p.staged_write("block_table", 1, 1, 20, 2048)
    p.step_end(1, 1, 0, 0, 1, 3, 0, 0, "none")
    p.request_finish("d", 7200, 2, 0, "length", 0)
    third = p.drain()
    assert rows(third, "steps", ["step", "cpu_start_ns", "cpu_end_ns", "num_decode_tokens"]) == [
        (13, start, clock.last, 1)
    ]
    assert rows(third, "spans", ["step", "name"]) == [(13, "step")]
    assert rows(third, "tokens") == [("d", 0, 7000, 42), ("d", 1, 7100, 43)]
    assert rows(third, "requests") == [("d", 40, 7000, 7200, 2, 2, 0, "length", 0)]
    assert rows(third, "staged_writes", ["step", "tensor"]) == [(13, "block_table")]
    assert num_rows(third["syncs"]) == num_rows(third["graph_dispatch"]) == 0
    # the first drain's arrays are copies: writing new rows did not change them
    for table, cols in kept.items():
        for k, v in cols.items():
            np.testing.assert_array_equal(first[table][k], v)


def test_unfinished_lists_arrived_but_not_finished(clock):
    p = RecordingProbe()
    assert p.unfinished() == []
    run_script(p, clock)
    assert p.unfinished() == ["d"]
    p.request_arrival("f", 60, 7)
    p.token("f", 0, 61, 1)
    assert sorted(p.unfinished()) == ["d", "f"]
    p.drain()
    assert sorted(p.unfinished()) == ["d", "f"]  # a drain does not forget arrivals
    p.request_finish("d", -1, 0, 0, None, 0)  # how the harness closes an interrupted run
    assert p.unfinished() == ["f"]
    p.request_finish("f", 70, 1, 0, "length", 0)
    assert p.unfinished() == []


def test_tokens_at_once_drain_as_the_same_rows_as_one_at_a_time():
    one, many = RecordingProbe(capacity=4), RecordingProbe(capacity=4)
    steps = [(["a", "b", "c"], [0, 0, 0], 100, [5, 6, 7]), (["a", "c"], [1, 1], 200, [8, 9])]
    for req_ids, idx, t_ns, token_ids in steps:
        for j, r in enumerate(req_ids):
            one.token(r, idx[j], t_ns, token_ids[j])
        many.step_tokens(req_ids, idx, t_ns, token_ids)
    many.step_tokens([], [], 300, [])  # an empty step records nothing
    for p in (one, many):
        p.request_arrival("b", 50, 3)
        p.request_finish("b", 250, 1, 0, "length", 0)
    a, b = one.drain(), many.drain()
    for table in ("tokens", "requests"):
        assert a[table].keys() == b[table].keys()
        for col in a[table]:
            assert list(a[table][col]) == list(b[table][col]), (table, col)
    assert list(b["tokens"]["req_id"]) == ["a", "b", "c", "a", "c"]
    assert list(b["requests"]["first_token_ns"]) == [100]  # b's first token, at step 1


def test_swap_hands_over_the_arrays_without_copying():
    p = RecordingProbe(capacity=8)
    p.step_begin(0)
    p.begin(api.SCHEDULE)
    p.end(api.SCHEDULE)
    before = p.spans.start_ns
    handoff = p.swap()
    assert np.shares_memory(handoff.raw["spans"]["start_ns"], before)
    assert p.spans.start_ns is not before and p.spans.n == 0
    p.begin(api.UPDATE)  # recording goes on in fresh arrays; the handed-over rows stay
    p.end(api.UPDATE)
    spans = p.decode(handoff)["spans"]
    assert list(spans["name"]) == ["schedule"] and list(spans["track"]) == ["cpu"]
    assert list(p.drain()["spans"]["name"]) == ["update"]


def test_the_open_phase_is_the_innermost_and_returns_to_its_parent():
    p = RecordingProbe()
    assert p.phase == -1
    p.begin(api.EXECUTE)
    p.begin(api.PREPARE)
    assert p.phase == api.PREPARE
    p.end(api.PREPARE)
    assert p.phase == api.EXECUTE
    p.end(api.EXECUTE)
    assert p.phase == -1
    p.step_begin(0)  # inside a step, outside its phases
    assert p.phase == api.STEP
    p.begin(api.UPDATE)
    assert p.phase == api.UPDATE
    p.end(api.UPDATE)
    assert p.phase == api.STEP
    p.step_end(1, 1, 0, 0, 1, 1, 0, 0, "none")
    assert p.phase == -1


def test_switch_ends_one_phase_and_begins_the_next_at_one_instant():
    p = RecordingProbe()
    p.step_begin(3)
    p.begin(api.EXECUTE)
    p.begin(api.PREPARE)
    p.switch(api.PREPARE, api.FORWARD)
    assert p.phase == api.FORWARD
    p.switch(api.FORWARD, api.SAMPLE)
    p.end(api.SAMPLE)
    assert p.phase == api.EXECUTE  # the switched-to phase returns to the first one's parent
    p.end(api.EXECUTE)
    assert p.phase == api.STEP
    p.step_end(1, 1, 0, 0, 1, 1, 0, 0, "none")
    spans = p.drain()["spans"]
    rows = zip(spans["name"], spans["start_ns"], spans["end_ns"], strict=True)
    got = {n: (a, b) for n, a, b in rows}
    assert list(spans["name"]) == ["prepare", "forward", "sample", "execute", "step"]
    assert set(spans["step"]) == {3}
    assert got["prepare"][1] == got["forward"][0]  # one timestamp for both
    assert got["forward"][1] == got["sample"][0]
    assert got["execute"][0] <= got["prepare"][0] <= got["prepare"][1] <= got["forward"][1]
    assert got["sample"][1] <= got["execute"][1] <= got["step"][1]


def test_given_back_arrays_are_reused_by_the_next_swap_and_empty_tables_hand_over_nothing():
    p = RecordingProbe(capacity=8)
    p.step_begin(0)
    p.begin(api.SCHEDULE)
    p.end(api.SCHEDULE)
    first = p.swap()
    handed = first.raw["spans"]["start_ns"].base
    assert len(first.raw["copies"]["bytes"]) == 0
    p.give_back(first)
    p.begin(api.UPDATE)
    p.end(api.UPDATE)
    second = p.swap()  # spans continued in the arrays given back: no allocation
    assert p.spans.start_ns is handed
    assert list(p.decode(second)["spans"]["name"]) == ["update"]
    assert second.raw["copies"] is first.raw["copies"]  # the same empty columns
