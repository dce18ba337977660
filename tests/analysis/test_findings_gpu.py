"""The findings of a real GPU run agree with the stored rows, recomputed here in plain SQL:
host-bound steps, graph keys never replayed, steps that fell back from FULL, implicit syncs.
Each rule is checked both ways: its number when it fires, its silence when the rows say the
threshold was not met."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mrv2_prof.analysis.findings import HOST_BOUND_SHARE, run_findings  # noqa: E402
from mrv2_prof.store import Store  # noqa: E402

GPU_SETS = (
    "runner.device=cuda", "runner.kernels=triton", "runner.cudagraph_mode=full_and_piecewise",
    "runner.async_scheduling=true", "probes.cuda_events=true", "probes.sync_finder=true",
    "workload.num_requests=32",
)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_findings_of_a_gpu_run_match_its_rows(run_in_process):
    job, _ = run_in_process(*GPU_SETS)
    with Store.open(job.db_path, read_only=True) as store:
        (run_id,) = store.connection.execute("SELECT run_id FROM runs").fetchone()
        found = {f.rule: f for f in run_findings(store, run_id)}
        q = store.connection.execute
        timed, bound = q(
            "SELECT count(*), count(*) FILTER (WHERE bubble_kind = 'host_bound' "
            "OR coalesce(starved_ns, 0) > 0) FROM steps WHERE run_id = ? "
            "AND bubble_ns IS NOT NULL AND NOT coalesce(perturbed, false)",
            [run_id],
        ).fetchone()
        captured = {f"{m}:{n}" for m, n in q(
            "SELECT mode, num_tokens FROM graph_captures WHERE run_id = ?", [run_id]
        ).fetchall()}  # fmt: skip
        replayed = {f"{m}:{n}" for m, n in q(
            "SELECT DISTINCT mode, padded_tokens FROM graph_dispatch "
            "WHERE run_id = ? AND hit AND mode <> 'none'", [run_id]
        ).fetchall()}  # fmt: skip
        dispatched, not_full = q(
            "SELECT count(*), count(*) FILTER (WHERE mode <> 'full') FROM graph_dispatch "
            "WHERE run_id = ?",
            [run_id],
        ).fetchone()
        (implicit,) = q(
            "SELECT count(*) FROM syncs WHERE run_id = ? AND kind = 'implicit'", [run_id]
        ).fetchone()
    assert timed > 0, "a GPU run with probes.cuda_events has a GPU timeline"
    share = bound / timed
    if share >= HOST_BOUND_SHARE:
        assert found["host_bound"].weight == pytest.approx(share)
    else:
        assert "host_bound" not in found
    unused = len(captured - replayed)
    if unused:
        assert found["unused_graphs"].text.startswith(
            f"{unused} of {len(captured)} captured graph keys were never replayed"
        )
    else:
        assert "unused_graphs" not in found
    if any(k.startswith("full:") for k in captured) and not_full:
        assert found["graph_fallback"].weight == pytest.approx(not_full / dispatched)
    else:
        assert "graph_fallback" not in found
    assert ("implicit_syncs" in found) == (implicit > 0)
    assert "not_completed" not in found
