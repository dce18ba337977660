"""The comparison page of several runs: its title says whether the runs share one scenario (a
sweep) or not, with a note naming the keys that differ; its numbers have thousands separators
and never an exponent; plotly.js, embedded compressed, unpacks and draws every figure."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from mrv2_prof.report.html_report import render_sweep_page
from mrv2_prof.report.sweep import HEADLINE_METRICS, Headline
from mrv2_prof.report.sweep_tables import format_value

GIVEN = "name: {name}\nseed: 0\nrunner:\n  max_num_seqs: {seqs}\n  kernels: {kernels}\n" \
        "store:\n  db: {db}\n"  # fmt: skip


def _run(run_id: str, *, combo=None, name="demo", seqs=8, kernels="torch", db="a.duckdb", **vals):
    values = {k: None for k, _, _ in HEADLINE_METRICS} | vals
    given = GIVEN.format(name=name, seqs=seqs, kernels=kernels, db=db)
    return Headline(run_id, run_id, "completed", combo or {}, values, given_yaml=given)


def _page(runs: list[Headline]) -> str:
    return render_sweep_page(runs, [r.given_yaml for r in runs])


def _headline_cells(page: str) -> dict[str, list[str]]:
    table = re.search(r'<table id="headlines">(.*?)</table>', page, re.S).group(1)
    rows = re.findall(r"<tr><th>([^<]*)</th>(.*?)</tr>", table, re.S)
    return {head: re.findall(r'<td class="num">([^<]*)</td>', cells) for head, cells in rows}


def test_a_sweep_differs_only_in_its_matrix_values_and_keeps_its_title():
    # kernels is the matrix key; the database each run was written to is no difference
    runs = [
        _run("aaa111", combo={"runner.kernels": "torch"}, kernels="torch", db="a.duckdb"),
        _run("bbb222", combo={"runner.kernels": "triton"}, kernels="triton", db="b.duckdb"),
    ]
    page = _page(runs)
    assert "<h1>mrv2-prof sweep report: 2 runs</h1>" in page
    assert 'id="scenarios-differ"' not in page


def test_runs_of_different_scenarios_are_a_comparison_with_a_note():
    runs = [
        _run("aaa111", seqs=8),
        _run("bbb222", seqs=16),
        _run("ccc333", seqs=8, name="other"),
    ]
    page = _page(runs)
    assert "sweep report" not in page
    assert "<h1>mrv2-prof comparison report: 3 runs of different scenarios</h1>" in page
    note = re.search(r'<p class="note" id="scenarios-differ">([^<]*)</p>', page).group(1)
    # by hand: name differs (ccc333), runner.max_num_seqs differs (bbb222); kernels, seed agree
    assert "differ (as given, beyond any matrix values) in name, runner.max_num_seqs:" in note


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (38134.2, "38,134"),
        (1234567.8, "1,234,568"),
        (999.96, "1,000"),
        (54.2134, "54.21"),
        (0.001234, "0.001234"),
        (32.0, "32"),
        (0.0, "0"),
        (None, "-"),
    ],
)
def test_values_have_separators_and_no_exponent(value, shown):
    assert format_value(value) == shown


def test_the_headline_table_and_hover_never_use_scientific_notation():
    runs = [
        _run("aaa111", combo={"runner.kernels": "torch"}, output_tokens_per_s=38134.2,
             ttft_p50_ms=0.001234),
        _run("bbb222", combo={"runner.kernels": "triton"}, kernels="triton",
             output_tokens_per_s=123456.0, ttft_p50_ms=12.5),
    ]  # fmt: skip
    page = _page(runs)
    cells = _headline_cells(page)
    assert cells["output tokens/s (tok/s)"] == ["38,134", "123,456"]
    assert cells["TTFT p50 (ms)"] == ["0.001234", "12.5"]
    table = re.search(r'<table id="headlines">(.*?)</table>', page, re.S).group(1)
    assert not re.search(r"\de[+-]\d", table)
    fig = re.search(r'data-fig-id="sweep">(.*?)</script>', page, re.S).group(1)
    bars = [t for t in json.loads(fig)["data"] if t["type"] == "bar"]
    assert all("%{y:,.4~r}" in t["hovertemplate"] for t in bars)


NODE_DRAW = """
const vm = require('vm');
const fs = require('fs');
const page = fs.readFileSync(0, 'utf8');
const blob = page.match(/id="mrv2-plotly-gz">([^<]*)</)[1];
const start = page.lastIndexOf('<script>') + '<script>'.length;
const boot = page.slice(start, page.indexOf('</script>', start));
const figs = [...page.matchAll(/data-fig-id="([^"]+)">([^<]*)<\\/script>/g)];
const drawn = [];
let code = null;
globalThis.Plotly = {newPlot: (id) => drawn.push(id)};  // the real one needs a DOM
globalThis.document = {
  getElementById: () => ({textContent: blob}),
  createElement: () => ({}),
  head: {appendChild: (s) => { code = s.text; }},
  body: {insertAdjacentHTML: (_, h) => console.log('FAILED ' + h)},
  querySelectorAll: () => figs.map(m => ({textContent: m[2], dataset: {figId: m[1]}})),
};
vm.runInThisContext(boot);
setTimeout(() => console.log(JSON.stringify({length: code && code.length, drawn})), 2000);
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node (a JavaScript engine)")
def test_the_page_unpacks_plotly_js_and_draws_every_figure():
    from plotly.offline import get_plotlyjs

    page = _page([_run("aaa111", output_tokens_per_s=1.0), _run("bbb222", seqs=9)])
    proc = subprocess.run(
        ["node", "-e", NODE_DRAW], input=page, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"length": len(get_plotlyjs()), "drawn": ["plot-sweep"]}
    # the whole page is plotly.js compressed plus the figures: far under plotly.js itself
    assert len(page.encode()) < len(get_plotlyjs()) / 2
