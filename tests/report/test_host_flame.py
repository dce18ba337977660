"""The host flame graph's tree (hand-worked) and its place in the report and in ``show``."""

from __future__ import annotations

import statistics

import duckdb
import pytest

from mrv2_prof.report.figure_meta import NotMeasured
from mrv2_prof.report.host_flame import ROOT, host_flame, icicle_nodes


def _insert_samples(store, rows: list[tuple[str, str, int]]) -> None:
    """``(phase, stack, t_ns)`` rows as run ``r``'s host samples."""
    for phase, stack, t in rows:
        store.connection.execute(
            "INSERT INTO host_samples (run_id, step, t_ns, phase, stack, depth) "
            "VALUES ('r', -1, ?, ?, ?, 1)",
            [t, phase, stack],
        )


def test_every_node_sums_the_time_and_samples_below_it():
    rows = [  # (phase, stack, seconds, samples)
        ("update", "a;b", 0.003, 3),
        ("update", "a;c", 0.4021, 2),
        ("schedule", "a;b", 0.0000004, 1),  # under half a microsecond: 0 wide, still counted
    ]
    ids, labels, parents, micros, samples = icicle_nodes(rows)
    tree = {
        i: (lab, par, us, n)
        for i, lab, par, us, n in zip(ids, labels, parents, micros, samples, strict=True)
    }
    s = "\x1f"
    assert tree == {
        ROOT: (ROOT, "", 405100, 6),
        "update": ("update", ROOT, 405100, 5),
        f"update{s}a": ("a", "update", 405100, 5),
        f"update{s}a{s}b": ("b", f"update{s}a", 3000, 3),
        f"update{s}a{s}c": ("c", f"update{s}a", 402100, 2),
        "schedule": ("schedule", ROOT, 0, 1),
        f"schedule{s}a": ("a", "schedule", 0, 1),
        f"schedule{s}a{s}b": ("b", f"schedule{s}a", 0, 1),
    }
    # a parent is exactly the sum of its children (Plotly drops a branch that exceeds it)
    for node in ids:
        kids = [us for i, us in zip(ids, micros, strict=True) if parents[ids.index(i)] == node]
        assert not kids or sum(kids) == micros[ids.index(node)]


def test_the_flame_graph_weights_each_sample_by_the_time_since_the_one_before(tmp_path):
    """``stack_seconds``, hand-worked over start-up and serving samples together: a sample
    stands for the wall time since the run's sample before it (the first, for the median
    interval), so a 400 ms stall is 400 ms wide, not one sample's width."""
    from mrv2_prof.analysis.host_samples import stack_seconds
    from mrv2_prof.store import Store

    ms = 1_000_000
    rows = [  # (phase, stack, t_ns): 5 ms apart but for one stall of 400 ms
        ("startup", "h;imp", 0),
        ("startup", "h;imp;load", 405 * ms),  # the stall, where the GIL came back
        ("startup", "h;imp", 410 * ms),
        ("forward", "h;step", 415 * ms),
        ("forward", "h;step", 420 * ms),
        ("idle", "h", 430 * ms),
    ]
    with Store.open(str(tmp_path / "s.duckdb")) as store:
        _insert_samples(store, rows)
        got = stack_seconds(store, "r")
        assert stack_seconds(store, "q") == []
    # intervals 405, 5, 5, 5, 10 ms; the first sample: their median, 5 ms
    assert [(p, st, round(sec * 1e3, 6), n) for p, st, sec, n in got] == [
        ("startup", "h;imp;load", 405.0, 1),
        ("forward", "h;step", 10.0, 2),  # ties: by samples, then phase and stack
        ("startup", "h;imp", 10.0, 2),
        ("idle", "h", 10.0, 1),
    ]
    fig = host_flame(got, 200)
    assert fig.layout.meta["sampled_s"] == pytest.approx(0.435)
    assert fig.layout.meta["num_samples"] == 6


def test_no_samples_is_not_measured_with_the_reason():
    assert host_flame([], 0) == NotMeasured("host_flame", "Host time by phase (sampled)",
                                            "probes.host_sampling_hz was 0")  # fmt: skip
    assert "no host samples" in host_flame([], 100).why


def test_the_report_and_show_carry_the_samples(run_in_process, monkeypatch):
    from typer.testing import CliRunner

    from mrv2_prof.analysis.host_samples import (
        stack_seconds,
        startup_host_frames,
        top_host_frames,
    )
    from mrv2_prof.cli import app
    from mrv2_prof.report.html_report import render_run_report
    from mrv2_prof.store import Store

    job, messages = run_in_process("probes.host_sampling_hz=300")
    run_id = messages[-1][1].run_id
    with Store.open(job.db_path, read_only=True) as store:
        page = render_run_report(store, run_id)
        top = top_host_frames(store, run_id, n=5)
        start = startup_host_frames(store, run_id, n=5)
        flame = stack_seconds(store, run_id)
        (startup,) = store.connection.execute(
            "SELECT count(*) FROM host_samples WHERE phase = 'startup'"
        ).fetchone()
    assert (
        'data-fig-id="host_flame"' in page
        and "not measured" not in page.split("host_flame")[1][:300]
    )
    serving = messages[-1][1].facts["host_samples"] - startup  # the shares leave start-up out
    assert top and sum(t["self_samples"] for t in top) <= serving
    assert abs(top[0]["share"] - top[0]["self_samples"] / serving) < 1e-9
    assert all(t["phase"] != "startup" for t in top)
    # each start-up sample stands for the wall time since the one before (the first: the
    # median interval): the same weights by SQL's lag over the stored rows
    with duckdb.connect(job.db_path, read_only=True) as con:
        rows = con.execute(
            "SELECT stack, t_ns - lag(t_ns) OVER (ORDER BY t_ns, stack) FROM host_samples "
            "WHERE phase = 'startup' ORDER BY t_ns, stack"
        ).fetchall()
        every = con.execute(
            "SELECT phase, stack, t_ns - lag(t_ns) OVER (ORDER BY t_ns, stack) FROM "
            "host_samples ORDER BY t_ns, stack"
        ).fetchall()
    # the flame graph: every sample of the run by the same weights, start-up and serving
    first_all = statistics.median(gap for *_, gap in every[1:]) / 1e9
    by_stack: dict[tuple[str, str], float] = {}
    for phase, stack, gap in every:
        by_stack[phase, stack] = by_stack.get((phase, stack), 0.0) + (
            first_all if gap is None else gap / 1e9
        )
    assert len(flame) == len(by_stack) and sum(n for *_, n in flame) == len(every)
    assert all(abs(sec - by_stack[p, st]) < 1e-9 for p, st, sec, _ in flame)
    assert flame[0][2] == max(by_stack.values())
    first = statistics.median(gap for _, gap in rows[1:]) / 1e9
    weights = [first if gap is None else gap / 1e9 for _, gap in rows]

    def frame_of(stack: str) -> str:
        frames = stack.split(";")
        return ([f for f in frames if "(mrv2_prof/" in f] or frames)[-1]

    pairs = zip(rows, weights, strict=True)
    mine = sum(w for (stack, _), w in pairs if frame_of(stack) == start[0]["frame"])
    assert start and len(rows) == startup and sum(t["samples"] for t in start) <= startup
    assert abs(start[0]["seconds"] - mine) < 1e-9
    assert abs(start[0]["share"] - mine / sum(weights)) < 1e-9
    assert start[0]["seconds"] == max(t["seconds"] for t in start)
    result = CliRunner().invoke(app, ["show", run_id, "--db", job.db_path])
    assert result.exit_code == 0, result.output
    assert "top host frames" in result.output and "start-up host samples" in result.output
    assert top[0]["frame"][:40] in result.output.replace("\n", "")
    assert start[0]["frame"][:40] in result.output.replace("\n", "")


def test_start_up_samples_count_for_the_package_s_innermost_frame(tmp_path):
    """``startup_host_frames``, hand-worked: a start-up sample stands for the wall time since
    the one before (the first, for the median interval) and counts for the innermost frame of
    the package's code on its stack (what it called outside the package with it), a stack
    with none for its top frame; a stall (an interval over four median ones: the GIL held by
    a C call) counts for the sample after it; the serving samples are ``top_host_frames``'
    alone."""
    from mrv2_prof.analysis.host_samples import (
        startup_host_frames,
        startup_stalls,
        top_host_frames,
    )
    from mrv2_prof.store import Store

    harness = "_run_sampled (mrv2_prof/pipeline/harness.py)"
    torch_import = "_import_torch (mrv2_prof/pipeline/harness.py)"
    profile = "profile_run (mrv2_prof/runner/worker/startup.py)"
    ms = 1_000_000
    rows = [  # (phase, stack, t_ns): start-up samples 5 ms apart, but for one stall of 400 ms
        ("startup", f"{harness};{torch_import};<module> (torch/__init__.py);get_data (x/y.py)", 0),
        ("startup", f"{harness};{torch_import}", 5 * ms),
        ("startup", f"{harness};{torch_import};create_module (<frozen>)", 405 * ms),  # stall
        ("startup", f"{harness};{profile};forward (nn/module.py)", 410 * ms),
        ("startup", f"{harness};{profile}", 415 * ms),
        ("startup", "<module> (a/b.py);f (a/c.py)", 420 * ms),  # no frame of the package
        ("startup", "<module> (a/b.py);f (a/c.py)", 425 * ms),
        ("forward", f"{harness};{profile}", 430 * ms),  # served: not start-up
    ]
    with Store.open(str(tmp_path / "s.duckdb")) as store:
        _insert_samples(store, rows)
        start = startup_host_frames(store, "r")
        stalls = startup_stalls(store, "r")
        top = top_host_frames(store, "r")
    # intervals 5, 5, 400, 5, 5, 5, 5 ms (the first: the median, 5): 430 ms in all
    assert [(t["frame"], t["samples"], round(t["seconds"] * 1e3, 6)) for t in start] == [
        (torch_import, 3, 410.0),
        ("f (a/c.py)", 2, 10.0),  # a tie: by frame
        (profile, 2, 10.0),
    ]
    assert [round(t["share"], 4) for t in start] == [round(410 / 430, 4), 0.0233, 0.0233]
    assert stalls == {"span_s": pytest.approx(0.43), "stalls": 1, "stalled_s": pytest.approx(0.4)}
    assert [(t["phase"], t["frame"], t["self_samples"], t["share"]) for t in top] == [
        ("forward", profile, 1, 1.0)
    ]


def test_a_single_start_up_sample_is_all_of_start_up(tmp_path):
    from mrv2_prof.analysis.host_samples import startup_host_frames, startup_stalls
    from mrv2_prof.store import Store

    with Store.open(str(tmp_path / "s.duckdb")) as store:
        store.connection.execute(
            "INSERT INTO host_samples (run_id, step, t_ns, phase, stack, depth) "
            "VALUES ('r', -1, 7, 'startup', 'g (mrv2_prof/x.py)', 1)"
        )
        start = startup_host_frames(store, "r")
        assert startup_stalls(store, "r") == {"span_s": 0.0, "stalls": 0, "stalled_s": 0.0}
        assert startup_stalls(store, "q") is None and startup_host_frames(store, "q") == []
    assert start == [{"frame": "g (mrv2_prof/x.py)", "samples": 1, "seconds": 0.0, "share": 1.0}]
