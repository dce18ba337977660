"""The sweep report's tables: the runs (status, matrix values, what each ran when it was
downgraded) and, transposed, their headline metrics (a row per metric, a column per run), so
the page grows in width with the number of runs only: eight runs fit a 1400 px page. Cells may
wrap after ``_``, ``→``, ``,`` and ``=`` (never inside a word)."""

from __future__ import annotations

import html

from mrv2_prof.report.sweep import HEADLINE_METRICS, Headline
from mrv2_prof.views.downgrades import matrix_cell


def _breakable(text: str) -> str:
    out = html.escape(text)
    for ch in ("_", "→", ",", "="):
        out = out.replace(ch, ch + "<wbr>")
    return out


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.4g}"


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
        + "".join(f'<td class="num">{_fmt(r.values.get(k))}</td>' for r in runs)
        + "</tr>"
        for k, title, unit in HEADLINE_METRICS
    )
    return f'<table id="headlines"><tr><th>metric</th>{run_heads}</tr>{rows}</table>'


def sweep_tables(runs: list[Headline]) -> str:
    return runs_table(runs) + headlines_table(runs)
