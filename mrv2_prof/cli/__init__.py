"""The ``mrv2-prof`` command line. Bad input ends with one line on stderr and exit code 2.

Exit codes of ``run``: 0 every run completed (or was stopped with ``q``), 1 a run started and
failed, 2 bad input (scenario, overrides, trace, checkpoint, database; no run row is written),
130 interrupted with Ctrl-C. ``--help`` is laid out by ``cli.help_text``.

One module per group of commands: ``run`` (a scenario, live), ``stored`` (runs, show),
``compare``, ``gate``, ``views`` (report, export, tui, nsys import) and ``fetch`` (a shipped
real model); they are
registered here, in the order ``--help`` lists them.
"""

from __future__ import annotations

import sys

import typer

try:  # typer >= 0.24 carries its own click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer on the real click
    from click import exceptions as click_errors

from mrv2_prof.cli.baseline import baseline_app
from mrv2_prof.cli.compare import compare
from mrv2_prof.cli.fetch import fetch
from mrv2_prof.cli.gate import gate
from mrv2_prof.cli.help_text import Command
from mrv2_prof.cli.run import run
from mrv2_prof.cli.stored import runs, show
from mrv2_prof.cli.views import export, nsys_app, report, tui

app = typer.Typer(
    help="Profile an embedded vLLM Model Runner V2 style runner: run a scenario, watch it live, "
    "then query the run in DuckDB.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # click's help: flags as flags, docstrings re-wrapped to the terminal
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """mrv2-prof: what each MRV2 mechanism buys on your GPU and workload."""


for _command in (run, runs, show, compare, gate, report, export, tui, fetch):
    app.command(cls=Command)(_command)
app.add_typer(nsys_app, name="nsys")
app.add_typer(baseline_app, name="baseline")


def main_entry(argv: list[str] | None = None) -> None:
    """The console script: ``app`` with its usage errors (an unknown option, a missing value)
    as one line on stderr and exit 2, like every other bad input; help is printed as click
    prints it (bare ``mrv2-prof`` shows it and exits 2, as before)."""
    try:
        code = app(prog_name="mrv2-prof", args=argv, standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        print(exc.ctx.get_help() if exc.ctx else str(exc), file=sys.stderr)
        sys.exit(2)
    except click_errors.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "mrv2-prof"
        message = " ".join(exc.format_message().split())
        print(f"error: {message} (see '{where} --help')", file=sys.stderr)
        sys.exit(2)
    except click_errors.ClickException as exc:
        print(f"error: {' '.join(exc.format_message().split())}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except (click_errors.Abort, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
