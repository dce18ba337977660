"""NVML telemetry: GPU utilisation, memory used and power, each with a sparkline of recent samples.

The samples come from the parent's NVML sampler (``SnapshotSource.gpu_samples``), not from the
snapshot; a CPU run (or a machine without NVML) shows the reason instead. The sparklines are
hidden until there are samples: an empty one draws a flat line that reads as zeros.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from textual.app import ComposeResult
from textual.widgets import Static

from mrv2_prof.tui.widgets.panel import Panel
from mrv2_prof.tui.widgets.spark_history import SparkHistory
from mrv2_prof.tui.widgets.value_row import ValueRow
from mrv2_prof.views.format import NO_VALUE, NOT_ON_CPU, format_bytes
from mrv2_prof.views.safe_text import plain
from mrv2_prof.views.snapshot import Snapshot

WAITING = "waiting for samples…"
SERIES = (("gpu-util", "utilisation", 1), ("gpu-mem", "memory used", 2), ("gpu-power", "power", 3))


def _value(value_id: str, v: float) -> str:
    if value_id == "gpu-mem":
        return format_bytes(int(v)) if v >= 0 else "n/a"
    if math.isnan(v):
        return "n/a"
    return f"{v:.0f} %" if value_id == "gpu-util" else f"{v:,.0f} W"


class GpuPanel(Panel):
    KEY, NAME, TITLE = "9", "gpu", "GPU (NVML)"

    def __init__(self) -> None:
        super().__init__()
        self.device = ""

    def compose(self) -> ComposeResult:
        yield Static(WAITING, id="gpu-note", classes="hint", markup=False)
        for value_id, name, _ in SERIES:
            yield ValueRow(name, value_id)
            yield SparkHistory(f"{value_id}-spark", shown=False)

    def show(self, snapshot: Snapshot) -> None:
        self.device = snapshot.device

    def show_gpu(self, samples: Sequence[Sequence[float]], note: str | None, device: str) -> None:
        note_widget = self.query_one("#gpu-note", Static)
        if not samples:
            cpu = device.startswith("cpu")
            if cpu:
                note_widget.update(f"{NOT_ON_CPU}: no GPU telemetry")
            else:
                note_widget.update(plain(note or WAITING))
            note_widget.display = True
            for value_id, _, _ in SERIES:
                self.set_value(value_id, NOT_ON_CPU if cpu else NO_VALUE)
                self._spark(value_id).set_shown(False)
            return
        note_widget.display = False
        span_s = (samples[-1][0] - samples[0][0]) / 1e9
        for value_id, _, col in SERIES:
            values = [float(row[col]) for row in samples]
            self.set_value(value_id, _value(value_id, values[-1]))
            clean = [v if v >= 0 else 0.0 for v in values if not math.isnan(v)]
            spark = self._spark(value_id)
            spark.set_shown(True)
            spark.plot(clean, span_s, _value(value_id, max(clean)) if clean else "n/a")

    def _spark(self, value_id: str) -> SparkHistory:
        return self.query_one(f"#{value_id}-spark-history", SparkHistory)
