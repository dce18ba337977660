"""One line per dashboard panel: the headline numbers of a snapshot, for the overview panel.

Plain functions (no Textual), so what the overview says can be tested on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from mrv2_prof.views.format import (
    NO_VALUE,
    NOT_ON_CPU,
    format_bytes,
    format_count,
    format_counts,
    format_ms_pair,
    format_ns_ms,
    format_percent,
    format_rate,
    format_site,
    gpu_only,
    staged_ratio,
)
from mrv2_prof.views.snapshot import Snapshot

# (t_ns, gpu_util %, mem_used_bytes, power_w, sm_clock_mhz), as ``SnapshotSource.gpu_samples``
GpuRow = Sequence[float]


def has_gpu_timeline(s: Snapshot) -> bool:
    """Overlap and bubbles are measured (a GPU timeline exists) in this snapshot."""
    return s.overlap_frac is not None or s.bubble_host_bound_ns > 0 or s.bubble_other_ns > 0


def token_progress(s: Snapshot) -> tuple[int, int] | None:
    """``(settled, due)`` output tokens for the progress bar: due is the total of every request's
    max_tokens, settled the part no longer to come (produced, or given up by a request that
    ended sooner). It moves in a burst run, where every request finishes at the last step.
    None where the snapshot does not carry the workload's max_tokens."""
    if s.tokens_due is None or s.tokens_left is None or s.tokens_due <= 0:
        return None
    return s.tokens_due - min(max(s.tokens_left, 0), s.tokens_due), s.tokens_due


def progress_line(s: Snapshot) -> str:
    """What the progress bar measures, next to it."""
    tokens = token_progress(s)
    if tokens is None:
        return f"requests {format_count(s.num_done)} / {format_count(s.num_requests)}"
    return f"tokens {format_count(tokens[0])} / {format_count(tokens[1])}"


def throughput_line(s: Snapshot) -> str:
    line = (
        f"{format_rate(s.tokens_per_s)} tok/s · {format_rate(s.steps_per_s)} steps/s · "
        f"{format_count(s.steps)} steps"
    )
    if s.spec_num_drafts:  # speculative decoding: tokens per verify (mean acceptance length)
        line += f" · spec {1 + s.spec_num_accepted_tokens / s.spec_num_drafts:.2f} tok/verify"
    return line


def spec_line(s: Snapshot) -> str | None:
    """Speculative decoding's slots and dynamic k so far; None when nothing speculated."""
    if not s.spec_num_drafts and not s.spec_reserved_slots and not s.spec_sat_out:
        return None
    parts = [f"k {s.spec_k}"]
    if s.spec_reserved_slots:
        share = format_percent(s.spec_reclaimed_slots / s.spec_reserved_slots)
        parts.append(f"{share} of {format_count(s.spec_reserved_slots)} slots reclaimed")
    if s.spec_sat_out:
        parts.append(f"{format_count(s.spec_sat_out)} sat out")
    e, c = s.spec_expected_tokens, s.spec_cost_ratio
    if e is not None and c is not None and c > 0:  # speculation pays above 1
        parts.append(f"pays {e / c:.2f} ({e:.2f} tok / {c:.2f}× time)")
    return " · ".join(parts)


def requests_line(s: Snapshot) -> str:
    return (
        f"{format_count(s.num_finished)} done · {format_count(s.num_aborted)} aborted · "
        f"{format_count(s.num_running)} running · {format_count(s.num_waiting)} waiting"
    )


def latency_line(s: Snapshot) -> str:
    """p50 / p99 of TTFT, ITL and TPOT."""
    parts = (
        ("TTFT", s.ttft_ms_p50, s.ttft_ms_p99),
        ("ITL", s.itl_ms_p50, s.itl_ms_p99),
        ("TPOT", s.tpot_ms_p50, s.tpot_ms_p99),
    )
    return " · ".join(f"{name} {format_ms_pair(a, b)}" for name, a, b in parts)


def overlap_line(s: Snapshot) -> str:
    if not has_gpu_timeline(s):
        return gpu_only(s.device, None) + (" (no GPU timeline)" * s.device.startswith("cpu"))
    host_bound, other = format_ns_ms(s.bubble_host_bound_ns), format_ns_ms(s.bubble_other_ns)
    return (
        f"{format_percent(s.overlap_frac)} hidden · bubbles {host_bound} host-bound, {other} other"
    )


def syncs_line(s: Snapshot) -> str:
    line = f"{format_count(s.num_syncs)} · {format_ns_ms(s.sync_blocked_ns)} blocked"
    if s.top_sync_sites:
        site, n = s.top_sync_sites[0]
        line += f" · top {format_site(site)} ({format_count(n)})"
    return line


def graphs_line(s: Snapshot) -> str:
    if s.graph_hit_rate is None:
        return NO_VALUE
    return f"{format_percent(s.graph_hit_rate)} replayed · {format_counts(s.graph_mode_counts)}"


def staged_line(s: Snapshot) -> str:
    ratio = format_percent(staged_ratio(s.staged_bytes, s.dense_bytes))
    return f"{format_bytes(s.staged_bytes)} vs {format_bytes(s.dense_bytes)} dense ({ratio})"


def kv_line(s: Snapshot) -> str:
    n = s.num_preemptions
    return f"{format_percent(s.kv_usage)} used · {format_count(n)} preemption{'s' * (n != 1)}"


def _finite(value: float) -> bool:
    return not math.isnan(value) and value >= 0


def gpu_line(samples: Sequence[GpuRow], note: str | None, device: str) -> str:
    """The newest NVML sample, the note of why there is none, or ``n/a on CPU``."""
    if not samples:
        if note is not None:
            return NOT_ON_CPU if device.startswith("cpu") else note
        return gpu_only(device, None)
    _, util, mem, power, _ = samples[-1]
    parts = [
        f"util {util:.0f} %" if _finite(util) else "util n/a",
        f"mem {format_bytes(int(mem))}" if mem >= 0 else "mem n/a",
        f"{power:,.0f} W" if _finite(power) else "power n/a",
    ]
    return " · ".join(parts)
