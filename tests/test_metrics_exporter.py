"""The metrics exporter (pipeline/metrics_exporter.py) fed hand-made snapshots: what a scrape of
``/metrics`` reads back, parsed with the Prometheus text-format parser, value by value; the
latencies each snapshot carries (pipeline/live_latencies.py, pipeline/live_stats.py)."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from pathlib import Path

import pytest

from mrv2_prof.pipeline.live_latencies import NewLatencies
from mrv2_prof.pipeline.live_stats import LiveStats
from mrv2_prof.pipeline.metrics_exporter import (
    COUNTERS,
    E2E_BUCKETS,
    GAUGES,
    GRAPH_DISPATCHES,
    HISTOGRAMS,
    MetricsExporter,
    MetricsPortError,
    serve,
    serving,
)
from mrv2_prof.views.snapshot import Snapshot
from tests.tui.test_live_stats import Req, Result

parser = pytest.importorskip("prometheus_client.parser")

NS = 1_000_000_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, dict[tuple, float]]:
    """Sample name -> {sorted labels: value}, every family of the exposition."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def snap(**fields) -> Snapshot:
    base = dict(
        run_id="r1", label="quickstart", elapsed_s=1.0, steps=0, steps_per_s=0.0,
        output_tokens=0, tokens_per_s=0.0, num_requests=4, num_waiting=0, num_running=0,
        num_finished=0, num_aborted=0, ttft_ms_p50=None, ttft_ms_p99=None, itl_ms_p50=None,
        itl_ms_p99=None, kv_usage=0.0, num_preemptions=0, staged_bytes=0, dense_bytes=0,
    )  # fmt: skip
    return Snapshot(**(base | fields))


RUN = (("model_name", "llama-tiny"), ("run_id", "r1"))


@pytest.fixture
def exporter():
    exp = MetricsExporter(free_port())
    exp.begin_run("r1", "llama-tiny")
    yield exp
    exp.close()


def test_gauges_counters_and_histograms_read_back_exactly(exporter):
    exporter.update(
        snap(
            steps=3, output_tokens=5, prompt_tokens=40, num_running=2, num_waiting=1,
            kv_usage=0.25, num_preemptions=1, staged_bytes=1024, dense_bytes=4096, num_syncs=3,
            sync_blocked_ns=1_500_000_000, bubble_host_bound_ns=250_000_000,
            graph_mode_counts=(("full", 2), ("none", 1)), graph_hit_rate=0.5,
            new_ttft_s=(0.125, 0.5), new_itl_s=(0.0625,), new_e2e_s=(),
        )
    )  # fmt: skip
    m = scrape(exporter.port)
    assert m["vllm:num_requests_running"][RUN] == 2
    assert m["vllm:num_requests_waiting"][RUN] == 1
    assert m["vllm:kv_cache_usage_perc"][RUN] == 0.25
    assert m["vllm:prompt_tokens_total"][RUN] == 40
    assert m["vllm:generation_tokens_total"][RUN] == 5
    assert m["vllm:num_preemptions_total"][RUN] == 1
    assert m["mrv2_prof:steps_total"][RUN] == 3
    assert m["mrv2_prof:staged_bytes_total"][RUN] == 1024
    assert m["mrv2_prof:dense_bytes_total"][RUN] == 4096
    assert m["mrv2_prof:syncs_total"][RUN] == 3
    assert m["mrv2_prof:sync_blocked_seconds_total"][RUN] == 1.5
    assert m["mrv2_prof:host_bound_bubble_seconds_total"][RUN] == 0.25
    assert m["mrv2_prof:graph_hit_ratio"][RUN] == 0.5
    dispatches = m["mrv2_prof:graph_dispatches_total"]
    assert dispatches[(("mode", "full"), *RUN)] == 2
    assert dispatches[(("mode", "none"), *RUN)] == 1
    assert "mrv2_prof:overlap_ratio" not in m  # None (a CPU run): no series
    ttft = "vllm:time_to_first_token_seconds"
    assert m[f"{ttft}_count"][RUN] == 2
    assert m[f"{ttft}_sum"][RUN] == 0.625
    buckets = {dict(k)["le"]: v for k, v in m[f"{ttft}_bucket"].items()}
    assert (buckets["0.1"], buckets["0.25"], buckets["0.5"], buckets["+Inf"]) == (0, 1, 2, 2)
    assert m["vllm:inter_token_latency_seconds_count"][RUN] == 1
    e2e = {dict(k)["le"] for k in m["vllm:e2e_request_latency_seconds_bucket"]}
    assert e2e == {str(b) for b in E2E_BUCKETS} | {"+Inf"}  # vLLM's buckets


def test_counters_follow_the_cumulative_totals_and_never_go_down(exporter):
    exporter.update(snap(output_tokens=5, prompt_tokens=40, new_e2e_s=(1.0,)))
    exporter.update(snap(output_tokens=12, prompt_tokens=70, new_e2e_s=(2.0, 3.0)))
    exporter.update(snap(output_tokens=11, prompt_tokens=70))  # a total lower: ignored
    m = scrape(exporter.port)
    assert m["vllm:generation_tokens_total"][RUN] == 12  # the total, not the sum of totals
    assert m["vllm:prompt_tokens_total"][RUN] == 70
    assert m["vllm:e2e_request_latency_seconds_count"][RUN] == 3  # every value, once
    assert m["vllm:e2e_request_latency_seconds_sum"][RUN] == 6.0


def test_each_run_has_its_own_series(exporter):
    exporter.begin_run("r2", "smollm2-135m")
    exporter.update(snap(output_tokens=5))
    exporter.update(snap(run_id="r2", output_tokens=3))
    m = scrape(exporter.port)["vllm:generation_tokens_total"]
    assert m == {RUN: 5, (("model_name", "smollm2-135m"), ("run_id", "r2")): 3}


def test_a_port_in_use_is_refused_in_one_line_and_close_frees_it():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(MetricsPortError) as exc:
            serve(port)
    message = str(exc.value)
    assert "\n" not in message and f"--metrics-port {port}" in message, message
    assert serving() is None
    exp = serve(port)  # free again
    assert serving() is exp
    exp.close()
    assert serving() is None
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # closed: the port is free


def test_new_latencies_come_in_batches_and_the_last_takes_the_rest():
    new = NewLatencies(batch=2)
    new.itl.extend([0.1, 0.2, 0.3, 0.4, 0.5])
    new.ttft.append(1.0)
    assert new.take() == {"new_ttft_s": (1.0,), "new_itl_s": (0.1, 0.2), "new_e2e_s": ()}
    assert new.take()["new_itl_s"] == (0.3, 0.4)
    new.itl.extend([0.6, 0.7])
    assert new.take(everything=True)["new_itl_s"] == (0.5, 0.6, 0.7)
    assert len(new) == 0


class Engine:
    num_waiting, num_running, num_kv_blocks_used = 0, 1, 2
    scheduler = type("Scheduler", (), {"num_preemptions": 0})()
    probe = None
    work = True

    def has_unfinished_requests(self) -> bool:
        return self.work


def test_live_stats_hands_each_latency_to_one_snapshot_in_seconds():
    live = LiveStats("r", "label", num_requests=2, num_kv_blocks=10)
    a, b = Req("a", 1.0, 1, num_prompt_tokens=7), Req("b", 1.5, 1, num_prompt_tokens=5)
    live.on_step(Result([a, b]), 2 * NS)  # TTFTs 1 s and 0.5 s
    engine = Engine()
    s = live.snapshot(engine)
    assert (s.prompt_tokens, s.new_ttft_s, s.new_itl_s, s.new_e2e_s) == (12, (1.0, 0.5), (), ())
    a.num_output_tokens, a.is_finished, a.finish_reason = 2, True, "stop"
    b.num_output_tokens, b.is_finished, b.finish_reason = 2, True, "abort"
    live.new.batch = 0  # nothing fits a batch: the values wait
    live.on_step(Result([a, b]), 2 * NS + NS // 4)
    assert live.snapshot(engine).new_itl_s == ()
    engine.work = False  # the run's last snapshot takes what is left
    s = live.snapshot(engine)
    assert s.new_itl_s == (0.25, 0.25)
    assert s.new_e2e_s == (1.25,)  # completed requests only (b was aborted)
    assert s.new_ttft_s == () and s.prompt_tokens == 12


DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana-dashboard.json"
METRIC = re.compile(r"\b((?:vllm|mrv2_prof):[a-z0-9_]+)")
SUFFIXES = ("_bucket", "_total")


def test_the_grafana_dashboard_reads_every_metric_and_only_those():
    """docs/grafana-dashboard.json: valid JSON whose queries name the exporter's metrics, each
    of them somewhere."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    named = set()
    for name in METRIC.findall(" ".join(exprs)):
        for suffix in SUFFIXES:
            name = name.removesuffix(suffix)
        named.add(name)
    defined = set(COUNTERS) | set(GAUGES) | set(HISTOGRAMS) | {GRAPH_DISPATCHES}
    assert named == defined
