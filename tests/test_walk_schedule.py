"""``benchmarks/walk_schedule.py``: the main loop's asynchronous copies read back from PTX (a
hand-written loop), and the decode walk compiled for sm_90 on this CPU host: at Triton's
default 3 stages a tile's K and V load only after the tile before was reduced, at 5 (what
``attention_triton.DECODE_STAGES`` may take) two tiles' are in flight, in more shared memory."""

from __future__ import annotations

import pytest

from tests.benchmark_runs import load_benchmark, nvidia_tool_here, run_benchmark

PTX = """
  cp.async.commit_group;
$L__BB0_1:
  ld.shared.b32 %r1, [%r2];
$L__BB0_2:
  cp.async.wait_group 3;
  mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {...};
  cp.async.cg.shared.global [%r3], [%rd1], 16;
  cp.async.commit_group;
  cp.async.cg.shared.global [%r4], [%rd2], 16;
  cp.async.commit_group;
  @%p1 bra $L__BB0_2;
  cp.async.wait_group 0;
  @%p2 bra $L__BB0_1;
  bra.uni $L__BB0_3;
$L__BB0_3:
  ret;
"""


def test_the_loop_is_the_back_branch_that_commits_most_and_its_head_wait(monkeypatch):
    """Two branches back and one forward: the inner loop ($L__BB0_2) commits two groups an
    iteration and waits at its head with three in flight; the outer loop ($L__BB0_1) holds the
    same two groups, no more, so the inner one is the main loop: (2, 3), two tiles in flight."""
    ws = load_benchmark("walk_schedule", monkeypatch)
    assert ws.loop_schedule(PTX) == (2, 3)
    assert ws.Schedule(2, 3, 0).tiles_in_flight == 2
    assert ws.Schedule(3, 0, 0).tiles_in_flight == 1 and ws.Schedule(0, 0, 0).tiles_in_flight == 1
    assert ws.loop_schedule("$L__BB0_1:\n  ret;\n") == (0, 0)


@pytest.mark.skipif(
    not nvidia_tool_here("ptxas"), reason="needs Triton's NVIDIA backend and its ptxas"
)
def test_five_stages_keep_two_key_tiles_in_flight(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # it compiles, for sm_90
    run = run_benchmark(
        "walk_schedule.py", tmp_path / "w.json", "--head-dims", "64", "--stages", "3", "5",
        timeout=300,
    )  # fmt: skip
    three, five = run.results
    assert (three["stages"], five["stages"]) == (3, 5)
    assert three["groups_per_tile"] == five["groups_per_tile"] > 0  # entries, K, V
    assert three["loop_wait"] == 0 and three["tiles_in_flight"] == 1
    assert five["loop_wait"] == five["groups_per_tile"] and five["tiles_in_flight"] == 2
    assert five["shared_bytes"] > 1.5 * three["shared_bytes"]  # a second tile's K and V buffers
    assert "| 64 | 5 | " in run.stdout and run.data["meta"]["target"] == "sm_90"
