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

    from mrv2_prof.analysis.host_samples import top_host_frames
    from mrv2_prof.cli import app
    from mrv2_prof.report.html_report import render_run_report
    from mrv2_prof.store import Store

    job, messages = run_in_process("probes.host_sampling_hz=300")
    run_id = messages[-1][1].run_id
    with Store.open(job.db_path, read_only=True) as store:
        page = render_run_report(store, run_id)
        top = top_host_frames(store, run_id, n=5)
    assert (
        'data-fig-id="host_flame"' in page
        and "not measured" not in page.split("host_flame")[1][:300]
    )
    total = messages[-1][1].facts["host_samples"]
    assert top and sum(t["self_samples"] for t in top) <= total
    assert abs(top[0]["share"] - top[0]["self_samples"] / total) < 1e-9
    result = CliRunner().invoke(app, ["show", run_id, "--db", job.db_path])
    assert result.exit_code == 0, result.output
    assert "top host frames" in result.output
    assert top[0]["frame"][:40] in result.output.replace("\n", "")
