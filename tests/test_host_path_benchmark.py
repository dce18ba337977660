"""``benchmarks/host_path.py --quick`` runs end to end on the CPU: every part, its markdown tables
and its JSON, with the phases read back from the harness's own spans."""

from __future__ import annotations

from tests.benchmark_runs import run_benchmark


def test_host_path_quick_runs_every_part(tmp_path):
    out = tmp_path / "host_path.json"
    args = ["--quick", "--batches", "1,4", "--repeats", "2", "--small-requests", "4"]
    run = run_benchmark("host_path.py", out, *args, timeout=600)
    results = run.results
    phases = [r for r in results if r["part"] == "phases"]
    assert {(r["batch"], r["probes"]) for r in phases} == {
        (b, p) for b in (1, 4) for p in ("default", "off")
    }
    for r in phases:
        assert r["decode_steps"] > 0
        # host prep spans schedule start to execute end: it covers both phases
        assert r["host_prep"] >= max(r["schedule"], r["execute"])
        assert r["execute"] >= r["prepare"]
    assert {r["batch"] for r in results if r["part"] == "engine"} == {1, 4}
    assert all(r["step_us"] > 0 for r in results if r["part"] == "hooks")
    flush = [r for r in results if r["part"] == "flush"]
    assert {r["batch"] for r in flush} == {1, 4} and all(r["flush_us"] > 0 for r in flush)
    syncs = [r for r in results if r["part"] == "syncfinder"]
    assert {r["batch"] for r in syncs} == {1, 4}
    for r in syncs:
        assert r["device"] == "cpu" and r["off_us"] > 0 and r["on_us"] > 0
        assert r["cost_us"] == r["on_us"] - r["off_us"]
    tput = [r for r in results if r["part"] == "throughput"]
    assert len(tput) == 2
    for r in tput:
        assert r["ratio"] == r["async_on"] / r["async_off"]
    headings = ("Host time per uniform-decode step", "Engine alone", "Flush on the step loop",
                "Sync finder + host-wait catcher")  # fmt: skip
    for heading in (*headings, "Async on/off"):
        assert heading in run.stdout
