"""The ``mrv2-prof`` command line. Bad input ends with one line on stderr and exit code 2.

Exit codes of ``run``: 0 every run completed (or was stopped with ``q``), 1 a run failed,
2 bad input (scenario, overrides, trace, checkpoint, database), 130 interrupted with Ctrl-C.

One module per group of commands: ``run`` (a scenario, live), ``stored`` (runs, show),
``compare`` (compare, gate) and ``views`` (report, export, tui, nsys import); they are
registered here, in the order ``--help`` lists them.
"""

from __future__ import annotations

import typer

from mrv2_prof.cli.compare import compare, gate
from mrv2_prof.cli.run import run
from mrv2_prof.cli.stored import runs, show
from mrv2_prof.cli.views import export, nsys_app, report, tui

app = typer.Typer(
    help="Profile an embedded vLLM Model Runner V2 style runner: run a scenario, watch it live, "
    "then query the run in DuckDB.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """mrv2-prof: what each MRV2 mechanism buys on your GPU and workload."""


for _command in (run, runs, show, compare, gate, report, export, tui):
    app.command()(_command)
app.add_typer(nsys_app, name="nsys")
