"""The migration gate: does a candidate run regress past thresholds against a baseline run?

A threshold is how far a metric may move in its worse direction (up for latencies, down for
throughput): ``5%`` of the baseline value, or an amount in the metric's unit (``+10``, ``-0.05``;
the sign is optional and, when written, must point the worse way). ``off`` drops a metric.
Crossing means strictly more than the limit; a relative limit on a baseline of 0 is crossed by
any worsening.

Thresholds come from ``DEFAULT_THRESHOLDS``, a YAML mapping (``metric: threshold``) and
``--max-regression`` flags, each overriding the one before metric by metric
(``report.gate_selection``: also ``--only`` and ``--replace-defaults``). The defaults are the
deployment gate of the MRV2 migration guide (TTFT/TPOT/ITL p50/p95/p99, throughput, peak GPU
memory, start-up and capture time, errors, aborts, preemptions). The guide names the metrics but
no numbers; the defaults are ours: 5% at p50 and for throughput and memory, 10% at p95/p99
(tails are noisier), 20% for start-up and capture, no new error or abort, 10% more preemptions;
no compile after warm-up where the baseline had none (``compiles_after_warmup``).

A metric not measured in a run fails the gate when it was asked for (file, flag or ``--only``);
a default metric measured in neither run is skipped (a CPU run has no GPU memory samples). With
``allow_missing`` every unmeasured metric is skipped. Bad input raises ``GateError``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from mrv2_prof.analysis.gate_metrics import LOWER, METRICS, RunMetrics
from mrv2_prof.inputs import limited_yaml
from mrv2_prof.inputs.finite_numbers import is_json_number, number_problem
from mrv2_prof.inputs.input_file import InputError, decode_utf8, read_bytes
from mrv2_prof.report.compare import MetricDelta, format_pct, metric_delta, run_title, titles
from mrv2_prof.views.safe_text import shown

MAX_THRESHOLDS_BYTES = 1 << 20

DEFAULT_THRESHOLDS: dict[str, str] = {
    "p50_ttft": "5%",
    "p95_ttft": "10%",
    "p99_ttft": "10%",
    "p50_tpot": "5%",
    "p95_tpot": "10%",
    "p99_tpot": "10%",
    "p50_itl": "5%",
    "p95_itl": "10%",
    "p99_itl": "10%",
    "req_throughput": "5%",
    "tok_throughput": "5%",
    "peak_gpu_mem": "5%",
    "startup_s": "20%",
    "capture_s": "20%",
    "errors": "+0",
    "aborts": "+0",
    "preemptions": "10%",
    "compiles_after_warmup": "+0",
}

PASS, FAIL, SKIP, INCONCLUSIVE = "pass", "FAIL", "skip", "inconclusive"
_THRESHOLD = re.compile(r"([+-]?)(\d+(?:\.\d*)?|\.\d+)(%?)")
_OFF = ("off", "none")
_EPS = 1e-9  # float noise: a change exactly at the limit passes


class GateError(ValueError):
    """Bad gate input (unknown metric, malformed threshold or file); ``str()`` is one line."""


@dataclass(frozen=True)
class Threshold:
    metric: str
    limit: float  # how far the metric may worsen: a fraction of the baseline, or an amount
    relative: bool

    def describe(self) -> str:
        """The limit signed the worse way: ``5%``/``+10`` (lower is better), ``-5%``/``-0.050``."""
        m = METRICS[self.metric]
        lower = m.direction == LOWER
        if self.relative:
            return f"{'' if lower else '-'}{100 * self.limit:g}%"
        return m.format_delta(self.limit if lower else -self.limit)


def _known() -> str:
    return "known: " + ", ".join(METRICS)


def _bad(where: str, value: Any, metric: str) -> GateError:
    m = METRICS[metric]
    worse = "+" if m.direction == LOWER else "-"
    unit = "" if m.unit in ("count", "fraction") else f" {m.unit}"
    return GateError(
        f"{where}: bad threshold {shown(value)}; expected a percentage of the baseline (5%), an "
        f"amount{unit} ({worse}10), or off"
    )


def parse_threshold(metric: str, value: Any, where: str) -> Threshold | None:
    """``value`` (text, or a YAML number/false) as a threshold on ``metric``; None for off."""
    if metric not in METRICS:
        raise GateError(f"{where}: unknown metric {metric!r}; {_known()}")
    if value is False or (isinstance(value, str) and value.strip().lower() in _OFF):
        return None
    if is_json_number(value):  # a YAML number: finite, as a scenario's numbers (no overflow)
        if (problem := number_problem(value)) is not None:
            raise GateError(f"{where}: bad threshold: {problem}")
        sign, number, pct = "-" if value < 0 else "", f"{abs(value):g}", ""
    elif isinstance(value, str) and (match := _THRESHOLD.fullmatch(value.strip())):
        sign, number, pct = match.groups()
    else:
        raise _bad(where, value, metric)
    m = METRICS[metric]
    worse_sign = "+" if m.direction == LOWER else "-"
    if sign and sign != worse_sign:
        way = "a rise" if m.direction == LOWER else "a drop"
        raise GateError(
            f"{where}: {metric} regresses by {way}, so its threshold is "
            f"{worse_sign}{number}{pct} (or {number}{pct}), not {sign}{number}{pct}"
        )
    limit = float(number) / (100 if pct else 1)  # digits only: inf at worst, never an error
    if not math.isfinite(limit):
        raise GateError(f"{where}: bad threshold {shown(value)}: not a finite number")
    return Threshold(metric, limit, relative=bool(pct))


def parse_flags(flags: Iterable[str]) -> dict[str, Threshold | None]:
    """``--max-regression`` values: ``METRIC=THRESHOLD``, repeatable or comma-separated."""
    parsed: dict[str, Threshold | None] = {}
    for flag in flags:
        for item in filter(None, (part.strip() for part in flag.split(","))):
            name, eq, value = item.partition("=")
            where = f"--max-regression {shown(item)}"
            if not eq or not name.strip() or not value.strip():
                raise GateError(f"{where}: expected METRIC=THRESHOLD, e.g. p99_itl=5%")
            parsed[name.strip()] = parse_threshold(name.strip(), value, where)
    return parsed


def load_thresholds(path: Path) -> dict[str, Threshold | None]:
    """A YAML file mapping metric names to thresholds, e.g. ``p99_itl: 5%``."""
    try:
        data_bytes = read_bytes(path, "thresholds file", MAX_THRESHOLDS_BYTES)
    except InputError as exc:
        raise GateError(f"{exc.file}: cannot read thresholds ({exc.problem})") from None
    try:
        text = decode_utf8(data_bytes, path, "thresholds file")
    except InputError:
        raise GateError(f"{path}: not a text file; expected YAML (p99_itl: 5%)") from None
    try:
        data = limited_yaml.load(text)
    except limited_yaml.YamlError as exc:
        at = f" at line {exc.line}" if exc.line is not None else ""
        raise GateError(f"{path}: not valid YAML{at} ({exc.problem})") from None
    if not isinstance(data, dict) or not data:
        got = "an empty file" if data is None else f"{type(data).__name__} {shown(data)}"[:60]
        raise GateError(
            f"{path}: expected a mapping of metric: threshold (e.g. p99_itl: 5%), got {got}"
        )
    return {
        str(name): parse_threshold(str(name), value, f"{path}: {name}")
        for name, value in data.items()
    }


def default_thresholds() -> dict[str, Threshold]:
    parsed = {name: parse_threshold(name, v, "default") for name, v in DEFAULT_THRESHOLDS.items()}
    return {name: t for name, t in parsed.items() if t is not None}


@dataclass(frozen=True)
class GateResult:
    threshold: Threshold
    delta: MetricDelta
    status: str  # pass | FAIL | skip | inconclusive (groups: the interval straddles the limit)
    message: str  # one line: "FAIL p99_itl: 12.40 ms -> 13.90 ms (+12.1% > 5%)"
    interval: tuple[float, float] | None = None  # groups: the change's interval (limit's terms)
    test: str | None = None  # the test behind the interval
    relative_interval: bool = True  # the interval is a fraction of the baseline (else in units)
    sample_verdict: str | None = None  # one run a side: the per-request bootstrap's verdict


def missing_result(
    t: Threshold, d: MetricDelta, base: RunMetrics, cand: RunMetrics, explicit: bool, allow: bool
) -> GateResult:
    """The result of a metric one side did not measure: skip or FAIL (see the module)."""
    where = []
    if d.a is None:
        where.append(f"baseline {base.run_id}")
    if d.b is None:
        where.append(f"candidate {cand.run_id}")
    both = len(where) == 2
    if allow or (both and not explicit):
        why = "either run" if both else where[0]
        return GateResult(t, d, SKIP, f"{SKIP} {t.metric}: not measured in {why}")
    return GateResult(t, d, FAIL, f"{FAIL} {t.metric}: not measured in {' and '.join(where)}")


def _check(t: Threshold, d: MetricDelta) -> GateResult:
    m = METRICS[t.metric]
    assert d.a is not None and d.b is not None and d.delta is not None
    worsened = d.delta if m.direction == LOWER else -d.delta
    if t.relative and d.a != 0:
        amount, change = worsened / abs(d.a), f"{d.delta_pct:+.1f}%"
    elif t.relative:  # any worsening from a baseline of 0 crosses a relative limit
        amount, change = (math.inf if worsened > 0 else 0.0), f"{m.format_delta(d.delta)} from 0"
    else:
        amount, change = worsened, m.format_delta(d.delta)
    failed = amount > t.limit + _EPS * max(1.0, t.limit)
    status = FAIL if failed else PASS
    cmp = ("> " if m.direction == LOWER else "< ") if failed else "within "
    line = f"{status} {t.metric}: {m.format(d.a)} -> {m.format(d.b)} ({change} {cmp}{t.describe()})"
    return GateResult(t, d, status, line)


def asked(explicit: bool | Collection[str], name: str) -> bool:
    """Whether the user asked for ``name``: ``explicit`` is True/False for every metric, or the
    names asked for."""
    return explicit if isinstance(explicit, bool) else name in explicit


def evaluate(
    thresholds: dict[str, Threshold],
    baseline: RunMetrics,
    candidate: RunMetrics,
    *,
    explicit: bool | Collection[str],
    allow_missing: bool = False,
) -> list[GateResult]:
    """One result per threshold, in ``METRICS`` order. ``explicit``: the metrics the user asked
    for (True: all of them)."""
    results = []
    for name in (n for n in METRICS if n in thresholds):
        t = thresholds[name]
        d = metric_delta(name, baseline.values[name], candidate.values[name])
        if d.measured:
            results.append(_check(t, d))
        else:
            chosen = asked(explicit, name)
            results.append(missing_result(t, d, baseline, candidate, chosen, allow_missing))
    return results


def passed(results: list[GateResult]) -> bool:
    """No failure nor inconclusive metric, and at least one metric measured in both runs (an
    empty gate is no pass)."""
    return any(r.status == PASS for r in results) and all(r.status in (PASS, SKIP) for r in results)


def exit_status(results: list[GateResult]) -> int:
    """0 pass, 1 a regression (or nothing measured in both), 3 inconclusive (no failure)."""
    if any(r.status == FAIL for r in results):
        return 1
    if any(r.status == INCONCLUSIVE for r in results):
        return 3
    return 0 if passed(results) else 1


def verdict_line(results: list[GateResult]) -> str:
    checked = [r for r in results if r.status != SKIP]
    failed = [r for r in checked if r.status == FAIL]
    unsure = [r for r in checked if r.status == INCONCLUSIVE]
    skipped = len(results) - len(checked)
    tail = f", {skipped} skipped" if skipped else ""
    metrics = "metric" if len(checked) == 1 else "metrics"
    if not checked:
        return f"gate: FAIL (no metric measured in both runs{tail})"
    if failed:
        return f"gate: FAIL ({len(failed)} of {len(checked)} {metrics}{tail})"
    if unsure:
        return f"gate: INCONCLUSIVE ({len(unsure)} of {len(checked)} {metrics}{tail})"
    return f"gate: PASS ({len(checked)} {metrics}{tail})"


def gate_table(
    results: list[GateResult], baseline: RunMetrics, candidate: RunMetrics, db: str, db_b: str
) -> Table:
    t = Table(
        title=titles(run_title("baseline ", baseline, db), run_title("candidate", candidate, db_b)),
        title_justify="left",
    )
    t.add_column("metric")
    for col in ("baseline", "candidate", "change", "limit"):
        t.add_column(col, justify="right")
    t.add_column("result")
    style = {PASS: "green", FAIL: "bold red", SKIP: "dim", INCONCLUSIVE: "yellow"}
    for r in results:
        m, d = METRICS[r.threshold.metric], r.delta
        change = "-"
        if d.delta is not None:
            change = f"{m.format_delta(d.delta)} ({format_pct(d.delta_pct, d.delta)})"
        t.add_row(
            m.name,
            m.format(d.a),
            m.format(d.b),
            change,
            r.threshold.describe(),
            Text(r.status, style=style[r.status]),
        )
    return t
