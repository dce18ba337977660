"""The report's sample of requests: what the model was asked and answered, with the latencies.

Only for a run whose requests have decoded text (``store.request_list.has_text``): the slowest
completed requests by E2E and a few typical ones (nearest the median E2E), each with TTFT, TPOT
and E2E, the prompt (its last user message when the chat template is a common one, else its
end) and the output, shortened. Every text is HTML-escaped.
"""

from __future__ import annotations

import html

from mrv2_prof.analysis.request_list import RequestRow, has_text, request_sample
from mrv2_prof.store.db import Store
from mrv2_prof.views.format import NO_VALUE, format_ms
from mrv2_prof.views.request_text import asked, head

SLOWEST, TYPICAL = 3, 5
PROMPT_CHARS, OUTPUT_CHARS = 200, 300
HEADER = ("", "request", "TTFT", "TPOT", "E2E", "prompt", "output")


def _text_cell(text: str | None, shorten) -> str:
    if text is None:
        return f'<td class="text">{NO_VALUE}</td>'
    return f'<td class="text">{html.escape(shorten(text))}</td>'


def _row(kind: str, r: RequestRow) -> str:
    numbers = "".join(
        f'<td class="num">{format_ms(v)}</td>' for v in (r.ttft_ms, r.tpot_ms, r.e2e_ms)
    )
    return (
        f'<tr class="{kind}" data-req-id="{html.escape(r.req_id, quote=True)}">'
        f"<td>{kind}</td><td>{html.escape(r.req_id)}</td>{numbers}"
        + _text_cell(r.prompt_text, lambda t: asked(t, PROMPT_CHARS))
        + _text_cell(r.output_text, lambda t: head(t, OUTPUT_CHARS))
        + "</tr>"
    )


def requests_html(store: Store, run_id: str) -> str:
    """The section (heading, one sentence, the table), or "" when the run has no text."""
    if not has_text(store, run_id):
        return ""
    sample = request_sample(store, run_id, SLOWEST, TYPICAL)
    if not sample:
        return ""
    header = "".join(f"<th>{h}</th>" for h in HEADER)
    rows = "".join(_row(kind, r) for kind, r in sample)
    return (
        '<h2 id="requests">Sample of requests</h2>'
        f'<p class="explain">The {SLOWEST} slowest completed requests by E2E, then {TYPICAL} '
        "typical ones (E2E nearest the median): the prompt's last user message (or its end) "
        "and the output, decoded and shortened.</p>"
        f'<table id="request-sample"><tr>{header}</tr>{rows}</table>'
    )
