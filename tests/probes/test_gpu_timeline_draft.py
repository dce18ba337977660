"""The optional ``G_DRAFT`` mark on the fake device: a step that runs a draft model gets a
``draft`` span from the mark to the step's end and its ``sample`` ends at the mark; a step
without it keeps the three phases. Expected values worked out by hand."""

from __future__ import annotations

from test_gpu_timeline import timeline  # noqa: F401 (the fixture)

from mrv2_prof.probes import gpu_timeline as gt
from mrv2_prof.probes.api import G_DRAFT, G_END, G_FORWARD, G_PREPARE, G_SAMPLE


def test_a_draft_mark_splits_the_steps_end_into_sample_and_draft(timeline):  # noqa: F811
    make, dev, spans = timeline
    t = make()
    assert gt.GPU_PHASES[3] == "draft"
    # step 0 with a draft model: prepare 600-700, forward 700-1700, sample 1700-1750,
    # draft 1750-1900; step 1 without: sample to the end
    dev.script.extend([600, 700, 1_700, 1_750, 1_900])
    for m in (G_PREPARE, G_FORWARD, G_SAMPLE, G_DRAFT, G_END):
        t.mark(0, m, -1)
    dev.script.extend([2_000, 2_100, 2_200, 2_300])
    for m in (G_PREPARE, G_FORWARD, G_SAMPLE, G_END):
        t.mark(1, m, -1)
    dev.done_until = 10_000
    assert t.poll() == 2
    host = 1_000_000 - 500  # device 500 is host 1_000_000
    assert spans == [
        (0, 0, host + 600, host + 700),
        (0, 1, host + 700, host + 1_700),
        (0, 2, host + 1_700, host + 1_750),
        (0, 3, host + 1_750, host + 1_900),
        (1, 0, host + 2_000, host + 2_100),
        (1, 1, host + 2_100, host + 2_200),
        (1, 2, host + 2_200, host + 2_300),
    ]
