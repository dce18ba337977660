"""The sweep report's tables: the runs (status, matrix values, what each ran when it was
downgraded) and, transposed, their headline metrics (a row per metric, a column per run), so
the page grows in width with the number of runs only: eight runs fit a 1400 px page. Cells may
wrap after ``_``, ``→``, ``,`` and ``=`` (never inside a word)."""

from __future__ import annotations

import html
import math

from mrv2_prof.report.sweep import HEADLINE_METRICS, Headline
from mrv2_prof.views.downgrades import matrix_cell

MAX_DECIMALS = 12  # a value under 5e-13 shows as 0


def _breakable(text: str) -> str:
    out = html.escape(text)
    for ch in ("_", "→", ",", "="):
        out = out.replace(ch, ch + "<wbr>")
    return out


def format_value(value: float | None) -> str:
    """A headline value with thousands separators and never in scientific notation: the whole
    number from 1,000 up (``38,134``), else four significant digits, trailing zeros dropped
    (``54.21``, ``0.001234``, ``32``); "-" when not measured."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    if value == 0 or abs(value) >= 1000:
        return f"{value:,.0f}"
    decimals = min(MAX_DECIMALS, max(0, 3 - math.floor(math.log10(abs(value)))))
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _ran_as(r: Headline) -> str:
    """The downgrades of keys outside the matrix (a matrix cell says its own)."""
    other = [d.short for d in r.downgrades if d.key not in r.combo]
    return f"ran {', '.join(other)}" if other else ("as asked" if not r.downgrades else "")


def runs_table(runs: list[Headline]) -> str:
    keys = list(dict.fromkeys(k for r in runs for k in r.combo))
    head = "".join(f"<th>{_breakable(k.rsplit('.', 1)[-1])}</th>" for k in keys) or "<th>label</th>"
    rows = []
    for r in runs:
        cells = [matrix_cell(r.combo.get(k), k, list(r.downgrades)) for k in keys] or [r.label]
        rows.append(
            f"<tr><td>{html.escape(r.run_id)}</td><td>{html.escape(r.status)}</td>"
            + "".join(f"<td>{_breakable(c)}</td>" for c in cells)
            + f'<td class="ran-as">{_breakable(_ran_as(r))}</td></tr>'
        )
    return (
        f'<table id="runs"><tr><th>run</th><th>status</th>{head}<th>ran as</th></tr>'
        f"{''.join(rows)}</table>"
    )


def headlines_table(runs: list[Headline]) -> str:
    run_heads = "".join(f'<th class="num">{html.escape(r.run_id)}</th>' for r in runs)
    rows = "".join(
        f"<tr><th>{html.escape(title)} ({unit})</th>"
        + "".join(f'<td class="num">{format_value(r.values.get(k))}</td>' for r in runs)
        + "</tr>"
        for k, title, unit in HEADLINE_METRICS
    )
    return f'<table id="headlines"><tr><th>metric</th>{run_heads}</tr>{rows}</table>'


def sweep_tables(runs: list[Headline]) -> str:
    return runs_table(runs) + headlines_table(runs)
