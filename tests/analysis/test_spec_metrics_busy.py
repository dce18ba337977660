"""Speculative decoding's draft and verify times on the device are busy time: a hand-built run
whose GPU spans carry starved time (the device waiting for the host inside them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrv2_prof.analysis.spec_metrics import spec_decode_summary
from mrv2_prof.analysis.summary import _spec_decode
from mrv2_prof.store import Store

MS = 1_000_000
T0 = 5_000_000_000


def _run(path: Path, gpu: bool) -> None:
    with Store.open(path) as store:
        store.begin_run("s1", scenario_name="x", label="x", matrix_combo=None, scenario_yaml="",
                        device="cuda" if gpu else "cpu", versions={}, started_ns=T0)  # fmt: skip
        store.append("s1", "steps", {
            "step": [0, 1], "cpu_start_ns": [T0, T0 + 10 * MS],
            "cpu_end_ns": [T0 + 9 * MS, T0 + 19 * MS], "num_tokens": [3, 1],
            "num_draft_tokens": [2, 0], "graph_mode": ["full", "full"],
        })  # fmt: skip
        # step 0 verified (its forward + sample count), step 1 did not (they do not)
        spans = [  # track, step, name, start ms, end ms, starved ms (None on the host)
            ("cpu", 0, "draft", 0, 1, None), ("cpu", 0, "forward", 1, 2, None),
            ("cpu", 0, "sample", 2, 3, None),
            ("cpu", 1, "draft", 10, 12, None), ("cpu", 1, "forward", 12, 13, None),
        ]  # fmt: skip
        if gpu:
            spans += [
                ("gpu", 0, "forward", 1, 5, 1), ("gpu", 0, "sample", 5, 6, 0.5),
                ("gpu", 0, "draft", 6, 9, 2.5), ("gpu", 1, "forward", 11, 14, 0),
                ("gpu", 1, "draft", 14, 18, 3),
            ]  # fmt: skip
        store.append("s1", "spans", {
            "track": [t for t, *_ in spans], "step": [s for _, s, *_ in spans],
            "name": [n for _, _, n, *_ in spans],
            "start_ns": [T0 + int(a * MS) for *_, a, _, _ in spans],
            "end_ns": [T0 + int(b * MS) for *_, b, _ in spans],
            "starved_ns": [None if x is None else int(x * MS) for *_, x in spans],
        })  # fmt: skip
        store.append("s1", "spec_verifies", {
            "step": [0], "req_id": ["r0"], "num_draft_tokens": [2], "num_accepted_tokens": [1],
        })  # fmt: skip
        store.finish_run("s1", "completed", ended_ns=T0 + 20 * MS)


def _summary(tmp_path: Path, gpu: bool):
    _run(tmp_path / "r.duckdb", gpu)
    with Store.open(tmp_path / "r.duckdb", read_only=True) as store:
        return spec_decode_summary(store, "s1")


def test_device_times_are_the_spans_less_their_starved_time(tmp_path: Path):
    d = _summary(tmp_path, gpu=True)
    # draft: (9 - 6 - 2.5) + (18 - 14 - 3) = 1.5 ms; verify (step 0 only): (4 - 1) + (1 - 0.5)
    assert (d.draft_track, d.verify_track) == ("gpu", "gpu")
    assert d.draft_ms == pytest.approx(1.5) and d.verify_ms == pytest.approx(3.5)
    assert d.draft_time_share == pytest.approx(1.5 / 5.0)
    line = _spec_decode(type("S", (), {"spec_decode": d})())
    assert "draft 1.5 ms (gpu busy) vs verify 3.5 ms (gpu busy): 30.0% drafting" in line


def test_host_times_are_the_host_spans(tmp_path: Path):
    d = _summary(tmp_path, gpu=False)
    assert (d.draft_track, d.verify_track) == ("cpu", "cpu")
    assert d.draft_ms == pytest.approx(3.0) and d.verify_ms == pytest.approx(2.0)
    assert d.mean_acceptance_length == pytest.approx(2.0)
