"""``mrv2-prof run --metrics-port``: a real quickstart run scraped while it runs, its counters at
the end (kept up by ``--metrics-linger``) equal to the stored run's totals; a port in use, or the
metrics extra missing, is one line and exit 2 with nothing written. The CLI's process runs with
torch unimportable, as a run's parent does (tests/test_cli_process_without_torch.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from mrv2_prof.analysis.metrics import run_summary
from mrv2_prof.store import Store

parser = pytest.importorskip("prometheus_client.parser")

WITHOUT = (
    "import sys; sys.modules[{name!r}] = None; sys.argv = ['mrv2-prof', *sys.argv[1:]]; "
    "from mrv2_prof.__main__ import main; main()"
)
NAMED = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "mrv2_prof:steps",
    "mrv2_prof:host_bound_bubble_seconds",
    "mrv2_prof:graph_dispatches",
    "mrv2_prof:staged_bytes",
    "mrv2_prof:syncs",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args: str, without: str = "torch") -> list[str]:
    """The command line of ``mrv2-prof ARGS`` with package ``without`` unimportable in it."""
    return [sys.executable, "-c", WITHOUT.format(name=without), *args]


def scrape(port: int) -> dict[str, float] | None:
    """``{sample name: value}`` (one run: one series per name, mode summed), None: not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    samples: dict[str, float] = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            if "le" not in s.labels:
                samples[s.name] = samples.get(s.name, 0.0) + s.value
    return samples


def test_a_live_run_is_scraped_and_its_counters_end_at_the_stored_totals(tmp_path):
    port, db = free_port(), tmp_path / "runs.duckdb"
    stdout = tmp_path / "stdout"
    args = cli("run", "--headless", "--db", str(db), "--metrics-port", str(port))
    args += ["--metrics-linger", "120", "--heartbeat", "0"]
    with stdout.open("w") as out:
        proc = subprocess.Popen(args, cwd=tmp_path, stdout=out, stderr=subprocess.PIPE, text=True)
    try:
        deadline, live, before_the_end = time.monotonic() + 240, None, False
        while time.monotonic() < deadline and proc.poll() is None:
            running = "status" not in stdout.read_text()  # no summary yet
            live = scrape(port)  # up from the checks on; the run's series once it started
            before_the_end |= live is not None and running
            if live is not None and "mrv2_prof:steps_total" in live:
                break
            time.sleep(0.05)
        assert live is not None, proc.stderr.read() if proc.poll() is not None else "no scrape"
        assert before_the_end  # served (and parsed) while the run was on
        for name in NAMED:
            assert any(s.startswith(name) for s in live), name
        while "status" not in stdout.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)  # the summary printed: the run is stored, its last snapshot applied
        end = scrape(port)
        assert end is not None and proc.poll() is None  # --metrics-linger keeps it serving
        with Store.open(db, read_only=True) as store:
            s = run_summary(store, store.resolve_run("latest"))
        assert end["vllm:prompt_tokens_total"] == s.prompt_tokens > 0
        assert end["vllm:generation_tokens_total"] == s.output_tokens > 0
        assert end["mrv2_prof:steps_total"] == s.steps
        assert end["mrv2_prof:requests_finished_total"] == s.num_completed
        assert end["vllm:time_to_first_token_seconds_count"] == s.num_requests
        assert end["vllm:e2e_request_latency_seconds_count"] == s.num_completed
        assert end["vllm:inter_token_latency_seconds_count"] == s.itl_ms.count
        assert end["mrv2_prof:staged_bytes_total"] == s.staged_bytes
        assert end["mrv2_prof:syncs_total"] == s.num_syncs
        proc.send_signal(signal.SIGINT)  # Ctrl-C while lingering: out at once, no traceback
        assert proc.wait(timeout=30) == 130
        assert "Traceback" not in proc.stderr.read()
        assert scrape(port) is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _refused(tmp_path: Path, port: int, without: str = "torch") -> subprocess.CompletedProcess:
    db = tmp_path / "runs.duckdb"
    args = cli("run", "--headless", "--db", str(db), "--metrics-port", str(port), without=without)
    done = subprocess.run(
        args, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stdout == "" and not db.exists() and list(tmp_path.iterdir()) == []
    return done


def test_a_port_in_use_is_one_line_exit_2_and_nothing_written(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = _refused(tmp_path, port)
    assert f"--metrics-port {port}: cannot serve on 127.0.0.1:{port}" in done.stderr


def test_without_the_metrics_extra_the_line_names_it(tmp_path):
    done = _refused(tmp_path, free_port(), without="prometheus_client")
    assert "pip install 'mrv2-prof[metrics]'" in done.stderr
