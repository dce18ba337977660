"""``benchmarks/spec_decode.py`` runs end to end on the CPU in its smoke mode and writes its
JSON and the markdown table for benchmarks/RESULTS.md."""

from __future__ import annotations

from tests.benchmark_runs import run_benchmark


def test_the_smoke_run_writes_every_config_and_batch(tmp_path):
    out, md = tmp_path / "spec.json", tmp_path / "spec.md"
    args = ["--cpu-smoke", "--markdown", str(md), "--configs", "off", "ngram k=2"]
    results = run_benchmark("spec_decode.py", out, *args, timeout=300).results
    assert [(r["config"], r["batch"]) for r in results] == [
        ("off", 1), ("off", 2), ("ngram k=2", 1), ("ngram k=2", 2),
    ]  # fmt: skip
    for r in results:
        assert r["tpot_ms"] > 0 and r["tok_s"] > 0
    assert results[0]["mean_acceptance_length"] is None  # spec decode off
    assert all(r["num_drafts"] > 0 for r in results[2:])  # repetitive prompts find drafts
    assert all(r["mean_acceptance_length"] >= 1 for r in results[2:])
    table = md.read_text()
    assert "| ngram k=2 | 2 |" in table and table.count("\n| ") == 6


def test_the_smoke_run_of_a_self_draft_reports_the_draft_against_the_step(tmp_path):
    out, md = tmp_path / "spec.json", tmp_path / "spec.md"
    args = ["--cpu-smoke", "--markdown", str(md), "--configs", "self-draft k=2"]
    results = run_benchmark("spec_decode.py", out, *args, timeout=300).results
    assert [(r["config"], r["batch"]) for r in results] == [
        ("self-draft k=2", 1),
        ("self-draft k=2", 2),
    ]
    for r in results:
        assert r["num_drafts"] > 0 and r["mean_acceptance_length"] >= 1
        assert 0 < r["draft_ms"] < r["step_ms"] and 0 < r["draft_share"] < 1
        assert r["draft_rounds"] > 0
    assert "| self-draft k=2 | 1 |" in md.read_text()
