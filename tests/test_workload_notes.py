"""Workload values a run could not honour as given, through the real command line on the tiny
CPU model: each is a note printed when the run starts and stored with the run
(``runs.info['notes']``), and the requests ran as the note says (cut to fit max_model_len)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
from typer.testing import CliRunner

from mrv2_prof.cli import app

runner = CliRunner()
SCENARIO = (
    "name: notes\nmodel: {preset: llama-tiny}\n"
    "runner: {device: cpu, kernels: torch, num_kv_blocks: 64, max_model_len: 256}\n"
)


def run(tmp_path: Path, workload: str, files: dict[str, str] | None = None):
    """Run the tiny scenario with ``workload``; (printed output, stored notes, requests)."""
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(text)
    (tmp_path / "s.yaml").write_text(SCENARIO + "workload: " + workload + "\n")
    db = tmp_path / "runs.duckdb"
    result = runner.invoke(app, ["run", str(tmp_path / "s.yaml"), "--db", str(db), "--headless"])
    assert result.exit_code == 0, (result.output, result.exception)
    with duckdb.connect(str(db), read_only=True) as con:
        (info,) = con.execute("SELECT info FROM runs").fetchone()
        reqs = con.execute(
            "SELECT req_id, prompt_tokens, output_tokens FROM requests ORDER BY req_id"
        ).fetchall()
    return " ".join(result.output.split()), json.loads(info)["notes"], reqs


def workload_notes(notes: list[str]) -> list[str]:
    return [n for n in notes if n.startswith("workload.")]


def test_a_shared_prefix_longer_than_max_model_len_is_cut_with_a_note(tmp_path):
    printed, notes, reqs = run(
        tmp_path,
        "{num_requests: 2, shared_prefix: {groups: 1, len: 300}, "
        "output_len: {dist: fixed, value: 4}, prompt_len: {dist: fixed, value: 8}}",
    )
    cut = (
        "workload.shared_prefix.len: 300 cut to 251 tokens in 2 of 2 requests (to fit "
        "max_model_len 256 with the request's output_len and a token of its own)"
    )
    raised = (
        "workload.prompt_len: 8 raised to 252 tokens in 2 of 2 requests (the shared prefix "
        "of 300 and a token of its own)"
    )
    assert workload_notes(notes) == [raised, cut]
    assert cut in printed and raised in printed
    assert reqs == [("req-0", 252, 4), ("req-1", 252, 4)]  # 251 of prefix, 1 of its own


def test_output_and_prompt_lengths_cut_to_fit_are_noted(tmp_path):
    _, notes, reqs = run(
        tmp_path,
        "{num_requests: 1, output_len: {dist: fixed, value: 300}, "
        "prompt_len: {dist: uniform, min: 8, max: 9}}",
    )
    assert workload_notes(notes) == [
        "workload.output_len: 300 cut to 255 tokens in 1 of 1 request (to fit max_model_len "
        "256 with a prompt token)",
        "workload.prompt_len: drawn lengths cut to 1 token in 1 of 1 request (to fit "
        "max_model_len 256 with the request's output_len)",
    ]
    assert reqs == [("req-0", 1, 255)]


def test_a_workload_that_fits_has_no_workload_note(tmp_path):
    _, notes, reqs = run(
        tmp_path,
        "{num_requests: 2, shared_prefix: {groups: 1, len: 16}, repeated_segment_len: 4, "
        "output_len: {dist: fixed, value: 4}, prompt_len: {dist: uniform, min: 24, max: 32}}",
    )
    assert workload_notes(notes) == []
    assert len(reqs) == 2


def test_a_trace_asked_for_more_requests_and_given_unused_keys_is_noted(tmp_path):
    lines = '{"prompt_len": 4, "max_tokens": 2}\n{"prompt_len": 3, "max_tokens": 2}\n'
    printed, notes, reqs = run(
        tmp_path,
        "{trace: t.jsonl, num_requests: 5, shared_prefix: {groups: 1, len: 8}}",
        {"t.jsonl": lines},
    )
    expected = [
        "workload.num_requests: 5 asked, the trace holds 2 requests",
        "workload.shared_prefix: set, but not used with a trace",
    ]
    assert workload_notes(notes) == expected
    assert all(note in printed for note in expected)
    assert [r[1:] for r in reqs] == [(4, 2), (3, 2)]
