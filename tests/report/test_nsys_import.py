"""Nsight import: kernels of a small hand-built nsys SQLite export, by step and phase.

The fixture follows the documented export schema. Its clock is the run's minus OFFSET (nsys
counts from the capture's start), the run's step spans trail the NVTX step ranges by 2 µs
(step 0) and 4 µs (step 1), and every expected value below is worked out by hand from the tables.
"""

import sqlite3

import pytest
from typer.testing import CliRunner

from mrv2_prof.analysis.nsys_import import NsysImportError, import_nsys
from mrv2_prof.cli import app
from mrv2_prof.store import Store

OFFSET = 123_456_789  # perf_counter_ns = nsys time + OFFSET
RUN = "abc123"
PID, OTHER_PID = 4242, 4100  # the runner process; the parent process (no mrv2 ranges)
VM = 1 << 48  # upper bits of a serialized GlobalId: hardware / VM id


def gtid(pid: int, tid: int) -> int:
    return VM | pid << 24 | tid


TA, TB, T_OTHER = gtid(PID, 4242), gtid(PID, 4250), gtid(OTHER_PID, 4100)
GPID, OTHER_GPID = gtid(PID, 0), gtid(OTHER_PID, 0)
MRV2, DEFAULT_DOMAIN = 1, 0

# mrv2 push/pop ranges on thread A: (phase, start, end, payload); sample of step 1 has none.
RANGES_A = [
    ("step", 2_000_000, 3_000_000, 0),
    ("schedule", 2_000_000, 2_100_000, 0),
    ("execute", 2_100_000, 2_800_000, 0),
    ("prepare", 2_150_000, 2_300_000, 0),
    ("forward", 2_300_000, 2_600_000, 0),
    ("sample", 2_600_000, 2_700_000, 0),
    ("update", 2_800_000, 3_000_000, 0),
    ("flush", 3_100_000, 3_200_000, 0),
    ("step", 4_000_000, 5_000_000, 1),
    ("schedule", 4_000_000, 4_080_000, 1),
    ("execute", 4_100_000, 4_800_000, 1),
    ("prepare", 4_150_000, 4_300_000, 1),
    ("forward", 4_300_000, 4_600_000, 1),
    ("sample", 4_600_000, 4_700_000, None),
    ("update", 4_800_000, 5_000_000, 1),
]
NVTX_NAME = {
    "step": "step",
    "schedule": "scheduler: schedule",
    "execute": "gpu_model_runner: execute_model",
    "prepare": "gpu_model_runner: preprocess",
    "forward": "gpu_model_runner: forward",
    "sample": "gpu_model_runner: sample",
    "update": "scheduler: update_from_output",
    "flush": "harness: flush",
}
# API calls: (correlationId, thread, start, eventClass, name); 0 runtime, 1 driver.
CALLS = [
    (1, TA, 2_050_000, 0, "cudaLaunchKernel_v7000"),  # step 0 schedule
    (2, TA, 2_200_000, 1, "cuLaunchKernel"),  # step 0 prepare (a Triton launch)
    (3, TA, 2_380_000, 0, "cudaLaunchKernel_v7000"),  # forward, inside two non-mrv2 ranges
    (4, TB, 2_400_000, 0, "cudaLaunchKernel_v7000"),  # thread B's flush range
    (5, TA, 2_750_000, 0, "cudaLaunchKernel_v7000"),  # execute, after sample ended
    (6, TA, 2_900_000, 0, "cudaLaunchKernel_v7000"),  # update
    (7, TA, 3_150_000, 0, "cudaLaunchKernel_v7000"),  # flush, after the step range
    (8, TA, 4_050_000, 0, "cudaLaunchKernel_v7000"),  # step 1 schedule
    (9, TA, 4_400_000, 0, "cudaGraphLaunch_v10000"),  # step 1 forward: a graph replay
    (10, TB, 4_350_000, 0, "cudaLaunchKernel_v7000"),  # thread B, no range around it
    (11, T_OTHER, 2_500_000, 0, "cudaLaunchKernel_v7000"),  # the other process
    (13, TA, 4_090_000, 0, "cudaLaunchKernel_v7000"),  # step 1, between schedule and execute
    (14, TA, 4_650_000, 0, "cudaLaunchKernel_v7000"),  # step 1 sample (range w/o payload)
    (15, TA, 4_720_000, 0, "cudaStreamSynchronize_v3020"),  # launches nothing
]
# Kernels: (correlationId, globalPid, start, end, streamId, name)
KERNELS = [
    (1, GPID, 2_200_000, 2_210_000, 7, "block_table_apply"),
    (2, GPID, 2_320_000, 2_330_000, 7, "prepare_inputs"),
    (3, GPID, 2_400_000, 2_500_000, 7, "gemm"),
    (4, GPID, 2_500_000, 2_510_000, 13, "flush_copy"),
    (5, GPID, 2_760_000, 2_770_000, 7, "argmax"),
    (6, GPID, 2_910_000, 2_920_000, 7, "update_state"),
    (7, GPID, 3_160_000, 3_170_000, 7, "stage_copy"),
    (8, GPID, 4_060_000, 4_070_000, 7, "block_table_apply"),
    (9, GPID, 4_450_000, 4_500_000, 7, "gemm"),
    (9, GPID, 4_500_000, 4_550_000, 7, "attention"),
    (9, GPID, 4_550_000, 4_600_000, 7, "gemm"),
    (10, GPID, 4_360_000, 4_370_000, 13, "side_copy"),
    (11, GPID, 4_700_000, 4_710_000, 7, "orphan"),  # id 11 has a call in the other process only
    (13, GPID, 4_100_000, 4_110_000, 7, "stage_copy"),
    (14, GPID, 4_660_000, 4_670_000, 7, "sampler"),
    (11, OTHER_GPID, 2_510_000, 2_520_000, 7, "other_process"),  # not the run's
]


def full(name: str) -> str:
    return f"void {name}<float>(float*)"


# (name, step, phase, start_ns, end_ns, stream) by start_ns: nsys time + 123_456_789; the
# demangled name is stored.
EXPECTED = [
    (full("block_table_apply"), 0, "schedule", 125_656_789, 125_666_789, 7),
    (full("prepare_inputs"), 0, "prepare", 125_776_789, 125_786_789, 7),
    (full("gemm"), 0, "forward", 125_856_789, 125_956_789, 7),
    (full("flush_copy"), 0, "flush", 125_956_789, 125_966_789, 13),
    (full("argmax"), 0, "execute", 126_216_789, 126_226_789, 7),
    (full("update_state"), 0, "update", 126_366_789, 126_376_789, 7),
    (full("stage_copy"), 0, "flush", 126_616_789, 126_626_789, 7),
    (full("block_table_apply"), 1, "schedule", 127_516_789, 127_526_789, 7),
    (full("stage_copy"), 1, "step", 127_556_789, 127_566_789, 7),
    (full("side_copy"), None, None, 127_816_789, 127_826_789, 13),
    (full("gemm"), 1, "forward", 127_906_789, 127_956_789, 7),
    (full("attention"), 1, "forward", 127_956_789, 128_006_789, 7),
    (full("gemm"), 1, "forward", 128_006_789, 128_056_789, 7),
    (full("sampler"), 1, "sample", 128_116_789, 128_126_789, 7),
    (full("orphan"), None, None, 128_156_789, 128_166_789, 7),
]

SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE NVTX_EVENTS (
    start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
    category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER,
    textId INTEGER REFERENCES StringIds(id), domainId INTEGER, uint64Value INTEGER,
    int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER,
    floatValue REAL, jsonTextId INTEGER, jsonText TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
    start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL,
    globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL REFERENCES StringIds(id),
    returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
    contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,
    globalPid INTEGER, demangledName INTEGER NOT NULL REFERENCES StringIds(id),
    shortName INTEGER NOT NULL REFERENCES StringIds(id), mangledName INTEGER,
    gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER,
    blockZ INTEGER, graphNodeId INTEGER);
"""


def make_capture(path, *, mark: bool = True, payloads: bool = True):
    """Write the export; ``payloads=False`` leaves every NVTX payload empty."""
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)
    ids: dict[str, int] = {}

    def sid(value: str) -> int:
        if value not in ids:
            ids[value] = len(ids) + 1
            con.execute("INSERT INTO StringIds VALUES (?, ?)", (ids[value], value))
        return ids[value]

    con.executemany(
        "INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)",
        [
            (i, n, n)
            for i, n in [(34, "NvtxMark"), (59, "NvtxPushPopRange"), (75, "NvtxDomainCreate")]
        ],
    )
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000, '', '')")
    con.executemany(
        "INSERT INTO ThreadNames VALUES (?, 0, ?)", [(sid("python"), TA), (sid("writer"), TB)]
    )

    def nvtx(event_type, start, end, tid, domain, *, text=None, text_id=None, payload=None):
        con.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, domainId, "
            "int64Value) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (start, end, event_type, text, tid, text_id, domain, payload if payloads else None),
        )

    nvtx(75, 500_000, None, TA, MRV2, text="mrv2")
    if mark:  # the runner's mark: 1_000_000 + OFFSET = 124_456_789
        message = f"mrv2 run {RUN} perf_counter_ns=124456789"
        nvtx(34, 1_000_000, None, TA, MRV2, text_id=sid(message), payload=124456789)
    for phase, start, end, payload in RANGES_A:
        nvtx(59, start, end, TA, MRV2, text_id=sid(NVTX_NAME[phase]), payload=payload)
    nvtx(59, 2_320_000, 2_450_000, TB, MRV2, text_id=sid("harness: flush"), payload=0)
    # Non-mrv2 ranges around call 3 (one named like an mrv2 phase): ignored.
    nvtx(59, 2_350_000, 2_400_000, TA, DEFAULT_DOMAIN, text="aten::mm")
    nvtx(59, 2_370_000, 2_390_000, TA, DEFAULT_DOMAIN, text="gpu_model_runner: sample")
    for corr, tid, start, event_class, name in CALLS:
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?, ?, 0, NULL)",
            (start, start + 5_000, event_class, tid, corr, sid(name)),
        )
    for corr, gpid, start, end, stream, name in KERNELS:
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES "
            "(?, ?, 0, 1, ?, ?, ?, ?, ?, NULL, 1, 1, 1, 128, 1, 1, NULL)",
            (start, end, stream, corr, gpid, sid(full(name)), sid(name)),
        )
    con.commit()
    con.close()
    return path


def make_run(store: Store, run_id: str = RUN, lag_ns: tuple[int, int] = (2_000, 4_000)) -> None:
    """The run's cpu spans: the main thread's ranges on the run clock, step s late by lag[s]."""
    store.begin_run(
        run_id,
        scenario_name="s",
        label="s",
        matrix_combo=None,
        scenario_yaml="name: s\n",
        device="cuda",
        versions={},
        started_ns=124_456_789,
        info={"nvtx_anchor_ns": 124_456_789},
    )
    rows = [
        (phase, payload if payload is not None else 1, s, e) for phase, s, e, payload in RANGES_A
    ]
    store.append(
        run_id,
        "spans",
        {
            "step": [step for _, step, _, _ in rows],
            "track": ["cpu"] * len(rows),
            "name": [phase for phase, _, _, _ in rows],
            "start_ns": [s + OFFSET + lag_ns[step] for _, step, s, _ in rows],
            "end_ns": [e + OFFSET + lag_ns[step] for _, step, _, e in rows],
        },
    )


def stored(store: Store, run_id: str = RUN):
    return store.connection.execute(
        "SELECT name, step, phase, start_ns, end_ns, stream FROM kernels WHERE run_id = ? "
        "ORDER BY start_ns",
        [run_id],
    ).fetchall()


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "runs.duckdb") as s:
        make_run(s)
        yield s


def test_each_kernel_gets_its_step_phase_and_run_clock_times(store, tmp_path):
    result = import_nsys(store, RUN, make_capture(tmp_path / "rep.sqlite"))
    assert stored(store) == EXPECTED
    assert result.alignment == "start mark"
    assert result.offset_ns == 123_456_789
    assert (result.num_kernels, result.num_with_step, result.num_in_phase) == (15, 13, 12)
    assert (result.num_no_api_call, result.num_outside_ranges) == (1, 1)
    # step ranges vs the run's step spans: 2 µs and 4 µs
    assert (result.num_steps_matched, result.residual_median_ns, result.residual_max_ns) == (
        2,
        3_000,
        4_000,
    )
    assert result.session_start_utc_ns == 1_700_000_000_000_000_000
    assert result.notes == []


def test_reimport_replaces_the_runs_kernels(store, tmp_path):
    capture = make_capture(tmp_path / "rep.sqlite")
    first = import_nsys(store, RUN, capture)
    second = import_nsys(store, "latest", capture)
    assert (first.num_replaced, second.num_replaced) == (0, 15)
    assert stored(store) == EXPECTED
    info = store.connection.execute("SELECT info FROM runs WHERE run_id = ?", [RUN]).fetchone()
    assert '"offset_ns": 123456789' in info[0] and '"nvtx_anchor_ns": 124456789' in info[0]


def test_without_the_start_mark_the_step_ranges_align(store, tmp_path):
    result = import_nsys(store, RUN, make_capture(tmp_path / "rep.sqlite", mark=False))
    # offset = median(OFFSET + 2_000, OFFSET + 4_000); residuals 1 µs each
    assert result.alignment == "step ranges" and result.offset_ns == 123_459_789
    assert (result.residual_median_ns, result.residual_max_ns) == (1_000, 1_000)
    assert any("no start mark" in note for note in result.notes)
    rows = stored(store)
    assert rows[0] == (full("block_table_apply"), 0, "schedule", 125_659_789, 125_669_789, 7)
    assert rows[12] == (full("gemm"), 1, "forward", 128_009_789, 128_059_789, 7)
    assert [r[1:3] for r in rows] == [e[1:3] for e in EXPECTED]


def test_without_payloads_steps_come_from_the_order_of_the_step_ranges(store, tmp_path):
    result = import_nsys(store, RUN, make_capture(tmp_path / "rep.sqlite", payloads=False))
    assert any("without payload" in note for note in result.notes)
    # The two flush ranges lie outside every step range: no step without a payload.
    expected = [(e[0], None if e[2] == "flush" else e[1], *e[2:]) for e in EXPECTED]
    assert stored(store) == expected
    assert (result.num_with_step, result.num_in_phase) == (11, 12)
    assert (result.residual_median_ns, result.residual_max_ns) == (3_000, 4_000)


def test_a_large_residual_is_reported(tmp_path):
    with Store.open(tmp_path / "runs.duckdb") as s:
        make_run(s, lag_ns=(5_000_000, 5_000_000))
        result = import_nsys(s, RUN, make_capture(tmp_path / "rep.sqlite"))
    assert result.residual_median_ns == 5_000_000
    assert any("5.0 ms" in note for note in result.notes)


def test_a_capture_of_another_run_is_refused(store, tmp_path):
    make_run(store, "def456")
    with pytest.raises(NsysImportError, match="capture of run abc123, not of run def456"):
        import_nsys(store, "def456", make_capture(tmp_path / "rep.sqlite"))
    assert stored(store, "def456") == []


def test_no_mark_and_no_matching_steps_cannot_align(tmp_path):
    with Store.open(tmp_path / "runs.duckdb") as s:
        make_run(s)
        s.connection.execute("DELETE FROM spans")
        with pytest.raises(NsysImportError, match="cannot align"):
            import_nsys(s, RUN, make_capture(tmp_path / "rep.sqlite", mark=False))


# --- the command line -----------------------------------------------------------------------

cli = CliRunner()


def test_cli_import_prints_counts_offset_and_residual(store, tmp_path):
    capture = make_capture(tmp_path / "rep.sqlite")
    db = store.path
    store.close()
    result = cli.invoke(app, ["nsys", "import", "latest", str(capture), "--db", str(db)])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert f"imported 15 kernels into run {RUN}" in out
    assert "attributed to a step: 13, to a phase: 12" in out
    assert "unattributed: 2 (1 without an API call" in out and "1 launched outside" in out
    assert "nsys time + 123456789 ns (from the start mark)" in out
    assert "over 2 steps: median 3.0 µs, max 4.0 µs" in out
    with Store.open(db, read_only=True) as s:
        assert stored(s) == EXPECTED


def test_cli_help_says_how_to_make_the_sqlite():
    result = cli.invoke(app, ["nsys", "import", "--help"])
    assert result.exit_code == 0
    assert "nsys export --type sqlite" in " ".join(result.output.split())


def _invoke(db, *args):
    return cli.invoke(app, ["nsys", "import", *args, "--db", str(db)])


def test_cli_not_an_sqlite_file_exits_2(store, tmp_path):
    bad = tmp_path / "rep.nsys-rep"
    bad.write_bytes(b"this is a report, not a database" * 100)
    store.close()
    result = _invoke(store.path, RUN, str(bad))
    assert result.exit_code == 2
    assert "rep.nsys-rep" in result.output and "not an SQLite file" in result.output
    assert "Traceback" not in result.output


def test_cli_missing_table_exits_2(store, tmp_path):
    partial = tmp_path / "nvtx_only.sqlite"
    con = sqlite3.connect(partial)
    con.executescript(SCHEMA.split("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME")[0])
    con.close()
    store.close()
    result = _invoke(store.path, RUN, str(partial))
    assert result.exit_code == 2
    out = " ".join(result.output.split())
    assert "nvtx_only.sqlite" in out
    assert "CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_KERNEL" in out


def test_cli_unknown_run_exits_2(store, tmp_path):
    capture = make_capture(tmp_path / "rep.sqlite")
    store.close()
    result = _invoke(store.path, "zzz", str(capture))
    assert result.exit_code == 2 and "no run 'zzz'" in result.output


def test_cli_missing_database_exits_2_and_creates_nothing(tmp_path):
    capture = make_capture(tmp_path / "rep.sqlite")
    result = _invoke(tmp_path / "none.duckdb", RUN, str(capture))
    assert result.exit_code == 2 and "none.duckdb" in result.output
    assert not (tmp_path / "none.duckdb").exists()
