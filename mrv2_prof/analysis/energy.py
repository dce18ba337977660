"""Energy per output token and per decode step, from NVML's total-energy counter.

The parent's NVML sampler stores the GPU's total energy counter with each sample
(``gpu_samples.energy_mj``: mJ since the driver loaded; NULL where the GPU does not report it).
The figures cover the interval between two of those samples, not the whole serving window
(``metrics.serving_window``), whose edges the samples miss by up to one sampling period:

* t0, t1: the first and the last sample inside the serving window that carry the counter;
* energy = counter(t1) - counter(t0), in J;
* J per output token = energy / the output tokens known in (t0, t1] (``tokens.t_ns``), so the
  numerator and the denominator cover the same interval;
* J per decode step = energy / the decode steps (no prefill token) whose CPU span lies in
  [t0, t1]. The energy is the whole interval's, its prefill steps' included: it is the
  interval's energy per decode step, not a decode step's own, which a counter read a few times
  a second cannot tell from its neighbours';
* mean power = energy / (t1 - t0).

Every step counts, the perturbed ones (a kernel-trace window) included, as in the throughput.
Not measured (``reason`` says why): no GPU samples, a GPU that does not report the counter,
fewer than two samples with it inside the window, or a counter that went back.
"""

from __future__ import annotations

from dataclasses import dataclass

from mrv2_prof.store.db import Store

_SOURCE = "NVML energy counter"


@dataclass(frozen=True)
class Energy:
    """NVML's energy counter over the sampled part of the serving window (module docstring)."""

    sampled: bool  # the run has GPU samples (False: a CPU run or NVML off: nothing to show)
    reason: str | None = None  # why the figures are not measured (None: measured)
    joules: float | None = None  # counter(t1) - counter(t0)
    seconds: float | None = None  # t1 - t0
    output_tokens: int = 0  # known in (t0, t1]
    decode_steps: int = 0  # no prefill token, CPU span inside [t0, t1]
    joules_per_output_token: float | None = None  # None without an output token in the interval
    joules_per_decode_step: float | None = None  # None without a decode step in the interval
    mean_power_w: float | None = None


def run_energy(store: Store, run_id: str, window: tuple[int, int] | None) -> Energy:
    """The energy figures of run ``run_id`` over ``window`` (the serving window, host ns)."""
    con = store.connection
    row = con.execute(
        "SELECT count(*), count(energy_mj) FROM gpu_samples WHERE run_id = ?", [run_id]
    ).fetchone()
    samples, with_energy = row if row is not None else (0, 0)
    if not samples:
        return Energy(False, "no GPU samples (a CPU run, or probes.nvml_hz 0)")
    if not with_energy:
        return Energy(True, "the GPU does not report NVML's energy counter")
    if window is None:
        return Energy(True, "no serving window (no request finished)")
    row = con.execute(
        "SELECT count(*), min(t_ns), arg_min(energy_mj, t_ns), max(t_ns), "
        "arg_max(energy_mj, t_ns) FROM gpu_samples WHERE run_id = ? "
        "AND energy_mj IS NOT NULL AND t_ns BETWEEN ? AND ?",
        [run_id, *window],
    ).fetchone()
    n, t0, e0, t1, e1 = row if row is not None else (0, None, None, None, None)
    if n < 2 or t1 <= t0:
        return Energy(True, "fewer than 2 NVML energy samples in the serving window")
    if e1 < e0:
        return Energy(True, "NVML's energy counter went back (the driver reloaded)")
    tokens, steps = con.execute(
        "SELECT (SELECT count(*) FROM tokens WHERE run_id = $run AND t_ns > $t0 "
        "AND t_ns <= $t1), (SELECT count(*) FROM steps WHERE run_id = $run "
        "AND num_prefill_tokens = 0 AND cpu_start_ns >= $t0 AND cpu_end_ns <= $t1)",
        {"run": run_id, "t0": t0, "t1": t1},
    ).fetchone()
    joules, seconds = (e1 - e0) / 1e3, (t1 - t0) / 1e9
    return Energy(
        True,
        joules=joules,
        seconds=seconds,
        output_tokens=int(tokens),
        decode_steps=int(steps),
        joules_per_output_token=joules / tokens if tokens else None,
        joules_per_decode_step=joules / steps if steps else None,
        mean_power_w=joules / seconds,
    )


def energy_rows(energy: Energy | None) -> list[tuple[str, str]]:
    """The ``energy`` row of the summary and the report: the figures, or why they are not
    measured on a run with GPU samples; nothing on a run without (a CPU run)."""
    if energy is None or not energy.sampled:
        return []
    if energy.reason is not None:
        return [("energy", f"- ({energy.reason})")]
    return [("energy", energy_line(energy))]


def energy_line(e: Energy) -> str:
    """``0.41 J per output token, 0.05 J per decode step, 412 W mean over 12.3 s (NVML energy
    counter)``; ``-`` for a figure without tokens or decode steps in the interval."""
    return (
        f"{_joules(e.joules_per_output_token)} per output token, "
        f"{_joules(e.joules_per_decode_step)} per decode step, {e.mean_power_w:,.0f} W mean "
        f"over {e.seconds:,.1f} s ({_SOURCE})"
    )


def _joules(v: float | None) -> str:
    """Three significant digits (a token's energy spans orders of magnitude across models)."""
    if v is None:
        return "-"
    return f"{v:,.0f} J" if v >= 1000 else f"{v:.3g} J"
