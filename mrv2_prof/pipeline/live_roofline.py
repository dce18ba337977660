"""The dashboard's roofline: the recent decode steps' median fraction of the roofline, live.

The same per-step figures as ``analysis/roofline.py`` (``step_figures``), over the last
``WINDOW`` steps the GPU timeline resolved: each step's row from the recording probe's buffer
(tokens, requests, drafts, context, pairs) paired by step number with its device time from the
timeline (``LiveTotals.recent_gpu``). Read when a snapshot is taken (~4 a second), never per
step; a run without a GPU timeline or machine peaks has none.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from mrv2_prof.analysis.roofline import COST_KEYS, step_figures

WINDOW = 256  # steps kept on each side
_COLUMNS = ("num_reqs", "num_tokens", "num_prefill_tokens", "num_draft_tokens",
            "context_tokens", "attn_pairs")  # fmt: skip


class LiveRoofline:
    def __init__(self, cost: dict[str, int], peaks: dict[str, Any]) -> None:
        self.cost, self.peaks = cost, peaks
        self._rows: OrderedDict[int, tuple[int, ...]] = OrderedDict()

    @classmethod
    def of(cls, cost: dict[str, int] | None, peaks: dict[str, Any] | None) -> LiveRoofline | None:
        """None when the run has no step cost or no HBM bandwidth (a CPU run)."""
        if not cost or any(k not in cost for k in COST_KEYS):
            return None
        if not (peaks or {}).get("hbm_read_bytes_per_s"):
            return None
        return cls(cost, peaks)

    def add_steps(self, w, lo: int, hi: int) -> None:
        """The step rows ``lo:hi`` of the probe's steps buffer (``RecordBuffer.w``)."""
        for i in range(lo, hi):
            self._rows[int(w.step[i])] = tuple(int(getattr(w, c)[i]) for c in _COLUMNS)
        while len(self._rows) > WINDOW:
            self._rows.popitem(last=False)

    def decode_fraction(self, recent_gpu) -> float | None:
        """Median fraction of the roofline over the recent decode steps with a device time."""
        rows = []
        for step, gpu_ns in recent_gpu:
            r = self._rows.get(step)
            if r is not None and r[2] == 0 and r[4] >= 0 and gpu_ns > 0:
                rows.append((step, *r, gpu_ns))
        if not rows:
            return None
        figures = step_figures(np.array(rows, dtype=np.float64), self.cost, self.peaks)
        return float(np.median(figures.fraction))
