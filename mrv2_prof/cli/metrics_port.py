"""``run --metrics-port PORT [--metrics-linger SECONDS]``: the metrics exporter's life in a command.

The port is bound among the command's checks, before any run row exists, so a port in use (or
one not permitted, or ``prometheus_client`` missing) is one line and exit 2 with nothing
written. The exporter then serves every run of the command (``pipeline/metrics_exporter.py``)
and is closed when the command ends, after the last run's final snapshot was applied and its
summary printed: ``--metrics-linger`` keeps it serving that many seconds more, for a last scrape
of the final values (none after a run stopped by a signal).
"""

from __future__ import annotations

from typer._click.globals import get_current_context  # typer's own click (cli/__init__.py)

from mrv2_prof.cli.console import fail

PORT_HELP = (
    "Serve live metrics for Prometheus on 127.0.0.1:PORT/metrics during the run (vLLM's metric "
    "names, plus mrv2_prof:*; needs the metrics extra). A port in use is refused before "
    "anything is written."
)
LINGER_HELP = (
    "With --metrics-port: keep serving SECONDS after the last run ends, so a scrape sees the "
    "final values. Default 0."
)
LINGER_MAX_S = 3600.0


def serve_metrics(port: int | None, linger_s: float) -> None:
    """Bind ``port`` (None: no metrics; refused: one line, exit 2) and close the exporter, after
    ``linger_s`` seconds, when the running command ends."""
    if port is None:
        if linger_s:
            fail("--metrics-linger: needs --metrics-port (the metrics it keeps serving)")
        return
    from mrv2_prof.pipeline.metrics_exporter import MetricsPortError, serve

    try:
        exporter = serve(port)
    except MetricsPortError as exc:
        fail(str(exc))
    get_current_context().call_on_close(lambda: exporter.close(linger_s))


def stop_lingering() -> None:
    """A signal ended the command: the exporter, if one serves, closes without its linger."""
    from mrv2_prof.pipeline.metrics_exporter import serving

    exporter = serving()
    if exporter is not None:
        exporter.stop_lingering()
