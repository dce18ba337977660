"""CPU/GPU overlap and bubbles: how much host prep hid under GPU work, and GPU idle time.

Needs the GPU timeline (CUDA events); a CPU run has none and says so. Host-bound bubbles count
the device's idle time before steps while the host was late and its starved time inside steps
(``probes.starvation``): both are the device waiting for the host.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Static

from mrv2_prof.tui.digest import has_gpu_timeline
from mrv2_prof.tui.widgets.panel import Panel
from mrv2_prof.tui.widgets.value_row import ValueRow
from mrv2_prof.views.format import format_ns_ms, format_percent, format_share, gpu_only
from mrv2_prof.views.snapshot import Snapshot

EXPLAINED = (
    "overlap: host prep of step N+1 hidden under GPU work of step N. "
    "bubble: GPU idle before a step; host-bound when it waited for the host."
)


class OverlapPanel(Panel):
    KEY, NAME, TITLE = "4", "overlap", "overlap & bubbles"

    def compose(self) -> ComposeResult:
        yield ValueRow("overlap", "overlap-frac")
        yield ValueRow("host-bound bubbles", "bubble-host-bound")
        yield ValueRow("other bubbles", "bubble-other")
        yield ValueRow("host-bound share", "bubble-share")
        yield ValueRow("decode roofline", "roofline")
        yield Static(EXPLAINED, classes="hint", markup=False)

    def show(self, snapshot: Snapshot) -> None:
        s = snapshot
        if not has_gpu_timeline(s):
            na = gpu_only(s.device, None)
            for value_id in ("overlap-frac", "bubble-host-bound", "bubble-other", "bubble-share",
                             "roofline"):  # fmt: skip
                self.set_value(value_id, na)
            return
        total = s.bubble_host_bound_ns + s.bubble_other_ns
        self.set_value("overlap-frac", format_percent(s.overlap_frac))
        self.set_value("bubble-host-bound", format_ns_ms(s.bubble_host_bound_ns))
        self.set_value("bubble-other", format_ns_ms(s.bubble_other_ns))
        self.set_value("bubble-share", format_share(s.bubble_host_bound_ns, total))
        self.set_value("roofline", format_percent(s.roofline_decode))
