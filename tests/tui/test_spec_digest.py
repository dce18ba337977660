"""The dashboard's overview says the mean acceptance length when speculative decoding ran, and
its slots and dynamic k on a row of its own, shown only then."""

from __future__ import annotations

import pytest
from textual.widgets import Static
from tui_helpers import POLL_S, FakeSource, make_snapshot, text, wait_for

from mrv2_prof.pipeline.live_stats import spec_decode_counts
from mrv2_prof.runner.config import SpecDecodeConfig
from mrv2_prof.runner.core.spec_scheduling import SpecScheduling
from mrv2_prof.tui.dashboard import DashboardApp
from mrv2_prof.tui.digest import spec_line, throughput_line


def test_tokens_per_verify_only_with_drafts():
    assert "spec" not in throughput_line(make_snapshot())
    line = throughput_line(make_snapshot(spec_num_drafts=4, spec_num_accepted_tokens=6))
    assert line.endswith(" · spec 2.50 tok/verify")  # 1 + 6 / 4


def test_the_live_counters_are_the_schedulers():
    class Engine:
        scheduler = type("S", (), {"spec": None})()

    assert spec_decode_counts(Engine()) == {}
    spec = SpecScheduling(SpecDecodeConfig(method="ngram"), async_scheduling=False)
    spec.stats.num_drafts, spec.stats.num_draft_tokens, spec.stats.num_accepted_tokens = 3, 9, 5
    Engine.scheduler.spec = spec
    assert spec_decode_counts(Engine()) == {
        "spec_num_drafts": 3,
        "spec_num_draft_tokens": 9,
        "spec_num_accepted_tokens": 5,
    }


def test_the_spec_line_slots_sit_outs_and_the_decision():
    assert spec_line(make_snapshot()) is None  # no speculation: no row
    full = make_snapshot(
        spec_num_drafts=4, spec_k=2, spec_reserved_slots=40, spec_reclaimed_slots=10,
        spec_sat_out=3, spec_expected_tokens=2.4, spec_cost_ratio=1.6,
    )  # fmt: skip
    # 10 / 40 reclaimed; pays 2.4 / 1.6 = 1.5
    assert spec_line(full) == (
        "k 2 · 25.0 % of 40 slots reclaimed · 3 sat out · pays 1.50 (2.40 tok / 1.60× time)"
    )
    off = make_snapshot(spec_num_drafts=4, spec_k=0, spec_reserved_slots=8,
                        spec_reclaimed_slots=8)  # fmt: skip
    assert spec_line(off) == "k 0 · 100.0 % of 8 slots reclaimed"  # no sit-out, no decision


@pytest.mark.asyncio
async def test_the_overview_shows_the_spec_row_only_while_speculating() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=(80, 24)) as pilot:
        row = app.query_one("#ov-spec", Static).parent
        source.push(make_snapshot())
        await wait_for(pilot, lambda: "400 steps" in text(app, "ov-throughput"))
        assert not row.display
        source.push(make_snapshot(spec_num_drafts=2, spec_k=3, spec_reserved_slots=6))
        await wait_for(pilot, lambda: text(app, "ov-spec").startswith("k 3"))
        assert row.display and text(app, "ov-spec") == "k 3 · 0.0 % of 6 slots reclaimed"
