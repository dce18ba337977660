"""A signal that ends ``run`` outside its runs (``cli/run.py`` ``_exit_interrupted``) also ends
``--metrics-linger``: the exporter closes at once instead of serving the linger out."""

from __future__ import annotations

import socket
import time

import pytest

pytest.importorskip("prometheus_client")

from mrv2_prof.cli import metrics_port  # noqa: E402
from mrv2_prof.pipeline import metrics_exporter  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_stop_lingering_closes_the_serving_exporter_without_its_linger():
    exporter = metrics_exporter.serve(_free_port())
    try:
        assert metrics_exporter.serving() is exporter
        metrics_port.stop_lingering()
        t0 = time.monotonic()
        exporter.close(60.0)
        assert time.monotonic() - t0 < 5.0
    finally:
        exporter.close(0.0)
    assert metrics_exporter.serving() is None
    metrics_port.stop_lingering()  # no exporter: nothing to do, no error


def test_without_the_signal_close_serves_the_linger():
    exporter = metrics_exporter.serve(_free_port())
    t0 = time.monotonic()
    exporter.close(0.5)
    assert time.monotonic() - t0 >= 0.45
