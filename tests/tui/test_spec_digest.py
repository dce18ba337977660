"""The dashboard's overview says the mean acceptance length when speculative decoding ran."""

from __future__ import annotations

from tui_helpers import make_snapshot

from mrv2_prof.live_stats import spec_decode_counts
from mrv2_prof.runner.core.spec_scheduling import SpecScheduling
from mrv2_prof.runner.spec_decode.config import SpecDecodeConfig
from mrv2_prof.tui.digest import throughput_line


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
