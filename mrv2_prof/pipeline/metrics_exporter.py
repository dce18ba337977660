"""Live metrics for Prometheus: ``/metrics`` on 127.0.0.1 during ``mrv2-prof run --metrics-port``.

The parent process serves them (``prometheus_client``, the ``metrics`` extra, imported only
here and only when a port is asked for) from the ``Snapshot``s the runner sends: the launcher
hands every snapshot it receives to ``MetricsExporter.update`` (dashboard or headless), so the
last one of a run is applied before the command closes the exporter. Every series carries
vLLM's ``model_name`` label (the run's model, from its start facts) and ``run_id``.

vLLM's names, types and buckets (vllm/v1/metrics/loggers.py) where vLLM has the metric: the
TTFT, inter-token and end-to-end latency histograms (each value the runner observed, from the
snapshots' ``new_*_s``), the running / waiting / KV-cache gauges, the prompt and generation token,
preemption and speculative-decoding counters. Ours under ``mrv2_prof:``: steps, finished and
aborted requests, overlap, bubble time (host-bound and other), graph dispatches per mode and the
hit ratio, staged and dense bytes, sync points and their blocked time. Counters are set from the
snapshots' cumulative totals (each update adds what grew since the run's previous snapshot).
"""

from __future__ import annotations

import errno
import threading
from typing import Any

from mrv2_prof.views.snapshot import Snapshot

HOST = "127.0.0.1"
EXTRA = "pip install 'mrv2-prof[metrics]'"
LABELS = ("model_name", "run_id")

# vLLM's buckets for these histograms (vllm/v1/metrics/loggers.py), in seconds
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

# name -> (help, Snapshot field, its scale to the metric's unit); shown as NAME_total
COUNTERS = {
    "vllm:prompt_tokens": ("Prompt tokens of the requests prefilled.", "prompt_tokens", 1),
    "vllm:generation_tokens": ("Generated (output) tokens.", "output_tokens", 1),
    "vllm:num_preemptions": ("Preemptions.", "num_preemptions", 1),
    "vllm:spec_decode_num_drafts": ("Verifies of drafts.", "spec_num_drafts", 1),
    "vllm:spec_decode_num_draft_tokens": ("Drafted tokens.", "spec_num_draft_tokens", 1),
    "vllm:spec_decode_num_accepted_tokens": (
        "Accepted draft tokens.",
        "spec_num_accepted_tokens",
        1,
    ),
    "mrv2_prof:steps": ("Engine steps.", "steps", 1),
    "mrv2_prof:requests_finished": ("Requests completed (stop or length).", "num_finished", 1),
    "mrv2_prof:requests_aborted": ("Requests aborted.", "num_aborted", 1),
    "mrv2_prof:host_bound_bubble_seconds": (
        "GPU idle time waiting for the host (between steps and starved inside them).",
        "bubble_host_bound_ns",
        1e-9,
    ),
    "mrv2_prof:other_bubble_seconds": (
        "The rest of the GPU idle time between steps.",
        "bubble_other_ns",
        1e-9,
    ),
    "mrv2_prof:staged_bytes": ("Bytes moved by staged writes.", "staged_bytes", 1),
    "mrv2_prof:dense_bytes": (
        "Bytes dense copies of the same tensors would move.",
        "dense_bytes",
        1,
    ),
    "mrv2_prof:syncs": ("Host-device sync points.", "num_syncs", 1),
    "mrv2_prof:sync_blocked_seconds": ("Host time blocked in syncs.", "sync_blocked_ns", 1e-9),
}
# name -> (help, Snapshot field); a None value leaves the series out
GAUGES = {
    "vllm:num_requests_running": ("Requests running.", "num_running"),
    "vllm:num_requests_waiting": ("Requests waiting (preempted ones included).", "num_waiting"),
    "vllm:kv_cache_usage_perc": ("KV-cache usage. 1 means 100 percent usage.", "kv_usage"),
    "mrv2_prof:overlap_ratio": ("Host prep hidden behind device work, of all.", "overlap_frac"),
    "mrv2_prof:graph_hit_ratio": ("Graph dispatches that replayed a graph.", "graph_hit_rate"),
    "mrv2_prof:decode_roofline_ratio": (
        "Recent decode steps' median fraction of the roofline.",
        "roofline_decode",
    ),
}
# name -> (help, Snapshot field of new values, buckets)
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": (
        "Histogram of time to first token in seconds.",
        "new_ttft_s",
        TTFT_BUCKETS,
    ),
    "vllm:inter_token_latency_seconds": (
        "Histogram of inter-token latency in seconds.",
        "new_itl_s",
        ITL_BUCKETS,
    ),
    "vllm:e2e_request_latency_seconds": (
        "Histogram of e2e request latency in seconds (completed requests).",
        "new_e2e_s",
        E2E_BUCKETS,
    ),
}
GRAPH_DISPATCHES = "mrv2_prof:graph_dispatches"  # a counter with a ``mode`` label


class MetricsPortError(Exception):
    """The port cannot be served (in use, not permitted) or ``prometheus_client`` is missing:
    one line naming ``--metrics-port``."""


class MetricsExporter:
    """Serves ``/metrics`` on ``127.0.0.1:port`` from its own ``CollectorRegistry`` (bound here:
    a port in use raises ``MetricsPortError``) until ``close()``."""

    def __init__(self, port: int) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise MetricsPortError(
                f"--metrics-port needs the prometheus_client package: {EXTRA}"
            ) from None
        self.port = port
        self.registry = CollectorRegistry()
        self._metrics = _define(self.registry)
        self._models: dict[str, str] = {}  # run_id -> model name
        self._totals: dict[tuple[str, ...], float] = {}  # (counter, labels...) -> value so far
        self._stop_lingering = threading.Event()
        try:
            self._server, self._thread = start_http_server(port, addr=HOST, registry=self.registry)
        except OSError as exc:
            why = exc.strerror or str(exc)
            hint = "; pick a free port" if exc.errno == errno.EADDRINUSE else ""
            raise MetricsPortError(
                f"--metrics-port {port}: cannot serve on {HOST}:{port} ({why}){hint}"
            ) from None

    def begin_run(self, run_id: str, model_name: str) -> None:
        """Run ``run_id`` started: its series are labelled with ``model_name``."""
        self._models[run_id] = model_name

    def update(self, snapshot: Snapshot) -> None:
        """Apply one snapshot: gauges set, counters raised to its totals, new latencies observed."""
        labels = (self._models.get(snapshot.run_id, ""), snapshot.run_id)
        for name, (_, field, _buckets) in HISTOGRAMS.items():
            histogram = self._metrics[name].labels(*labels)
            for value in getattr(snapshot, field):
                histogram.observe(value)
        for name, (_, field) in GAUGES.items():
            value = getattr(snapshot, field)
            if value is not None:
                self._metrics[name].labels(*labels).set(value)
        for name, (_, field, scale) in COUNTERS.items():
            self._raise_to(name, labels, getattr(snapshot, field) * scale)
        for mode, count in snapshot.graph_mode_counts:
            self._raise_to(GRAPH_DISPATCHES, (*labels, mode), count)

    def _raise_to(self, name: str, labels: tuple[str, ...], total: float) -> None:
        """Counter ``name`` of ``labels`` up to ``total`` (a counter never goes down)."""
        key = (name, *labels)
        grown = total - self._totals.get(key, 0)
        counter = self._metrics[name].labels(*labels)
        if grown > 0:
            counter.inc(grown)
            self._totals[key] = total

    def stop_lingering(self) -> None:
        """``close`` stops serving at once (a run stopped by a signal: the user wants out)."""
        self._stop_lingering.set()

    def close(self, linger_s: float = 0.0) -> None:
        """Keep serving ``linger_s`` seconds more (a last scrape of the final values; none
        after ``stop_lingering``), then stop serving and free the port."""
        global _serving
        try:
            if linger_s > 0:
                self._stop_lingering.wait(linger_s)
        finally:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
        if _serving is self:
            _serving = None


_serving: MetricsExporter | None = None  # the one a run command serves (one port a process)


def serve(port: int) -> MetricsExporter:
    """Bind ``port`` (``MetricsPortError``: in use, not permitted, the extra missing) and make
    its exporter the one every run's launcher feeds until it is closed."""
    global _serving
    _serving = MetricsExporter(port)
    return _serving


def serving() -> MetricsExporter | None:
    """The exporter ``serve`` started and not yet closed; None: no ``--metrics-port``."""
    return _serving


def _define(registry) -> dict[str, Any]:
    """Every metric, in ``registry``, by name."""
    from prometheus_client import Counter, Gauge, Histogram

    metrics: dict[str, Any] = {}
    for name, (doc, _, buckets) in HISTOGRAMS.items():
        metrics[name] = Histogram(name, doc, LABELS, registry=registry, buckets=buckets)
    for name, (doc, _) in GAUGES.items():
        metrics[name] = Gauge(name, doc, LABELS, registry=registry)
    for name, (doc, _, _) in COUNTERS.items():
        metrics[name] = Counter(name, doc, LABELS, registry=registry)
    metrics[GRAPH_DISPATCHES] = Counter(
        GRAPH_DISPATCHES,
        "Graph dispatches per chosen mode (full, piecewise, none).",
        (*LABELS, "mode"),
        registry=registry,
    )
    return metrics
