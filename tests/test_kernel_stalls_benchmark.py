"""``benchmarks/kernel_stalls.py`` reads Nsight Compute's raw CSV: units converted, kernels put
together by name, grid and the kernel before them (two ops of one kernel and grid told apart),
stall reasons weighted by each launch's duration (a table worked by hand; the GPU run is the
benchmark's own)."""

from __future__ import annotations

import pytest

from tests.benchmark_runs import load_benchmark, run_benchmark

DUR = "gpu__time_duration.sum"
REGS = "launch__registers_per_thread"
LS = "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"
BAR = "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
SAMPLED = "smsp__pcsamp_warps_issue_stalled_wait"


def raw_csv(unit: str = "usecond") -> str:
    head = ["ID", "Kernel Name", "Grid Size", "Block Size", DUR, REGS, LS, BAR, SAMPLED]
    units = ["", "", "", "", unit, "register/thread", "", "", ""]
    rows = [  # two layers of three launches: attention, then two projections on one grid
        ["0", "_attend", "(3, 1, 1)", "(64, 1, 1)", "5", "96", "1", "3", "100"],
        ["1", "_gemv(float*)", "(30, 1, 1)", "(128, 1, 1)", "3", "40", "6", "2", "100"],
        ["2", "_gemv(float*)", "(30, 1, 1)", "(128, 1, 1)", "1,000", "40", "", "", "7"],
        ["3", "_attend", "(3, 1, 1)", "(64, 1, 1)", "5", "96", "1", "3", "100"],
        ["4", "_gemv(float*)", "(30, 1, 1)", "(128, 1, 1)", "1", "40", "2", "2", "100"],
        ["5", "_gemv(float*)", "(30, 1, 1)", "(128, 1, 1)", "999", "40", "", "", "7"],
    ]
    lines = [",".join(f'"{c}"' for c in r) for r in [head, units, *rows]]
    return "==PROF== Connected\n" + "\n".join(lines) + "\n"


def test_raw_table_is_read_and_grouped(monkeypatch):
    ks = load_benchmark("kernel_stalls", monkeypatch)
    kernels = ks.parse_raw(raw_csv())
    assert [k["duration"] for k in kernels] == [5.0, 3.0, 1000.0, 5.0, 1.0, 999.0]  # "1,000"
    assert kernels[1]["stalls"] == {"long_scoreboard": 6.0, "barrier": 2.0}  # the ratio family
    assert kernels[2]["stalls"] == {"wait": 7.0}  # no ratios: the sampled counts
    groups = {(g["name"], g["grid"], g["after"]): g for g in ks.summarize(kernels)}
    # the projection after attention and the one after it: one grid, two ops, a launch a layer
    first = groups[("_gemv(float*)", "(30, 1, 1)", "_attend")]
    assert first["launches"] == 2 and first["total_us"] == 4.0 and first["us_per_launch"] == 2.0
    second = groups[("_gemv(float*)", "(30, 1, 1)", "_gemv")]
    assert second["launches"] == 2 and second["total_us"] == 1999.0
    # weighted by duration: long_scoreboard 6*3 + 2*1 = 20, barrier 2*3 + 2*1 = 8 -> 20/28, 8/28
    (r1, s1), (r2, s2) = first["top_stalls"]
    assert (r1, r2) == ("long_scoreboard", "barrier")
    assert s1 == pytest.approx(20 / 28) and s2 == pytest.approx(8 / 28)
    # the first attention follows nothing, the second a projection: two groups of one launch
    assert groups[("_attend", "(3, 1, 1)", "")]["launches"] == 1
    assert groups[("_attend", "(3, 1, 1)", "_gemv")]["launches"] == 1
    assert [g["total_us"] for g in ks.summarize(kernels)] == [1999.0, 5.0, 5.0, 4.0]  # most first


def test_launch_order_is_the_ids_not_the_rows(monkeypatch):
    ks = load_benchmark("kernel_stalls", monkeypatch)
    kernels = ks.parse_raw(raw_csv())
    shuffled = [kernels[i] for i in (5, 0, 3, 1, 4, 2)]
    key = lambda g: (g["name"], g["grid"], g["after"], g["launches"], g["total_us"])  # noqa: E731
    assert sorted(map(key, ks.summarize(shuffled))) == sorted(map(key, ks.summarize(kernels)))


def test_durations_in_nanoseconds_are_converted(monkeypatch):
    ks = load_benchmark("kernel_stalls", monkeypatch)
    assert [k["duration"] for k in ks.parse_raw(raw_csv("nsecond"))][:2] == [0.005, 0.003]


def test_not_a_raw_table_is_refused(monkeypatch):
    ks = load_benchmark("kernel_stalls", monkeypatch)
    with pytest.raises(ValueError, match="ID header"):
        ks.parse_raw("Kernel,Duration\nx,1\n")


def test_summarize_a_saved_table_through_the_command(tmp_path):
    raw = tmp_path / "raw.csv"
    raw.write_text(raw_csv())
    run = run_benchmark("kernel_stalls.py", tmp_path / "out.json", "--summarize", str(raw),
                        timeout=120)  # fmt: skip
    assert "6 kernels, 2013.0 µs of kernel bodies measured alone" in run.stdout
    assert "| _gemv | (30, 1, 1) | _attend | (128, 1, 1) | 2 | 2.00 | 4.0 |" in run.stdout
    groups = run.results[0]["groups"]
    assert [g["launches"] for g in groups] == [2, 1, 1, 2]
