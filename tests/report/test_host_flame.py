"""The host flame graph's tree (hand-worked) and its place in the report and in ``show``."""

from __future__ import annotations

from mrv2_prof.report.figure_meta import NotMeasured
from mrv2_prof.report.host_flame import ROOT, host_flame, icicle_nodes


def test_every_node_counts_the_samples_below_it():
    rows = [("update", "a;b", 3), ("update", "a;c", 2), ("schedule", "a;b", 1)]
    ids, labels, parents, values = icicle_nodes(rows)
    tree = {i: (lab, par, v) for i, lab, par, v in zip(ids, labels, parents, values, strict=True)}
    s = "\x1f"
    assert tree == {
        ROOT: (ROOT, "", 6),
        "update": ("update", ROOT, 5),
        f"update{s}a": ("a", "update", 5),
        f"update{s}a{s}b": ("b", f"update{s}a", 3),
        f"update{s}a{s}c": ("c", f"update{s}a", 2),
        "schedule": ("schedule", ROOT, 1),
        f"schedule{s}a": ("a", "schedule", 1),
        f"schedule{s}a{s}b": ("b", f"schedule{s}a", 1),
    }


def test_no_samples_is_not_measured_with_the_reason():
    assert host_flame([], 0) == NotMeasured("host_flame", "Host samples by phase",
                                            "probes.host_sampling_hz was 0")  # fmt: skip
    assert "no host samples" in host_flame([], 100).why


def test_the_report_and_show_carry_the_samples(run_in_process, monkeypatch):
    from typer.testing import CliRunner

    from mrv2_prof.analysis.host_samples import startup_host_frames, top_host_frames
    from mrv2_prof.cli import app
    from mrv2_prof.report.html_report import render_run_report
    from mrv2_prof.store import Store

    job, messages = run_in_process("probes.host_sampling_hz=300")
    run_id = messages[-1][1].run_id
    with Store.open(job.db_path, read_only=True) as store:
        page = render_run_report(store, run_id)
        top = top_host_frames(store, run_id, n=5)
        start = startup_host_frames(store, run_id, n=5)
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
    assert start and abs(start[0]["share"] - start[0]["samples"] / startup) < 1e-9
    result = CliRunner().invoke(app, ["show", run_id, "--db", job.db_path])
    assert result.exit_code == 0, result.output
    assert "top host frames" in result.output and "start-up host samples" in result.output
    assert top[0]["frame"][:40] in result.output.replace("\n", "")
    assert start[0]["frame"][:40] in result.output.replace("\n", "")


def test_start_up_samples_count_for_the_package_s_innermost_frame(tmp_path):
    """``startup_host_frames``, hand-worked: a start-up sample counts for the innermost frame of
    the package's code on its stack (what it called outside the package with it), a stack with
    none for its top frame; the serving samples are ``top_host_frames``' alone."""
    from mrv2_prof.analysis.host_samples import startup_host_frames, top_host_frames
    from mrv2_prof.store import Store

    harness = "_run_sampled (mrv2_prof/pipeline/harness.py)"
    torch_import = "_import_torch (mrv2_prof/pipeline/harness.py)"
    profile = "profile_run (mrv2_prof/runner/worker/startup.py)"
    rows = [  # (phase, stack, samples)
        ("startup", f"{harness};{torch_import};<module> (torch/__init__.py);get_data (x/y.py)", 5),
        ("startup", f"{harness};{torch_import}", 1),
        ("startup", f"{harness};{profile};forward (nn/module.py)", 3),
        ("startup", "<module> (a/b.py);f (a/c.py)", 2),  # no frame of the package
        ("forward", f"{harness};{profile}", 4),  # served: not start-up
    ]
    with Store.open(str(tmp_path / "s.duckdb")) as store:
        for phase, stack, k in rows:
            for _ in range(k):
                store.connection.execute(
                    "INSERT INTO host_samples (run_id, step, t_ns, phase, stack, depth) "
                    "VALUES ('r', -1, 0, ?, ?, 1)",
                    [phase, stack],
                )
        start = startup_host_frames(store, "r")
        top = top_host_frames(store, "r")
    assert [(t["frame"], t["samples"]) for t in start] == [
        (torch_import, 6),
        (profile, 3),
        ("f (a/c.py)", 2),
    ]
    assert [round(t["share"], 4) for t in start] == [round(6 / 11, 4), round(3 / 11, 4), 0.1818]
    assert [(t["phase"], t["frame"], t["self_samples"], t["share"]) for t in top] == [
        ("forward", profile, 4, 1.0)
    ]
