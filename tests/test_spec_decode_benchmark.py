"""``benchmarks/spec_decode.py`` runs end to end on the CPU in its smoke mode and writes its
JSON and the markdown table for benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_smoke_run_writes_every_config_and_batch(tmp_path):
    out, md = tmp_path / "spec.json", tmp_path / "spec.md"
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(BENCHMARKS / "spec_decode.py"), "--cpu-smoke", "--out", str(out)]
    cmd += ["--markdown", str(md), "--configs", "off", "ngram k=2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
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
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(BENCHMARKS / "spec_decode.py"), "--cpu-smoke", "--out", str(out)]
    cmd += ["--markdown", str(md), "--configs", "self-draft k=2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert [(r["config"], r["batch"]) for r in results] == [
        ("self-draft k=2", 1),
        ("self-draft k=2", 2),
    ]
    for r in results:
        assert r["num_drafts"] > 0 and r["mean_acceptance_length"] >= 1
        assert 0 < r["draft_ms"] < r["step_ms"] and 0 < r["draft_share"] < 1
        assert r["draft_rounds"] > 0
    assert "| self-draft k=2 | 1 |" in md.read_text()
