"""``run --executor ray --metrics-port``: a Ray cell's snapshots are recorded on its worker and
replayed into the driver's exporter as the cell lands (pipeline/executors/metrics_replay.py), so
a scrape during ``--metrics-linger`` reads, for each run, the stored run's totals under its
``run_id`` label. A local Ray cluster of CPUs, as tests/test_executors_ray.py starts one."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.error
import urllib.request

import duckdb
import pytest

from tests.test_executors_ray import cli
from tests.test_metrics_exporter import free_port

parser = pytest.importorskip("prometheus_client.parser")

LANDED = re.compile(r"cell \d/2 completed on .* run (\w+) ")


def scrape_by_run(port: int) -> dict[str, dict[str, float]] | None:
    """``{run_id: {sample name: value}}`` (buckets left out, graph modes summed); None: not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    runs: dict[str, dict[str, float]] = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            if "run_id" in s.labels and "le" not in s.labels:
                series = runs.setdefault(s.labels["run_id"], {})
                series[s.name] = series.get(s.name, 0.0) + s.value
    return runs


def test_ray_cells_reach_the_drivers_metrics_with_their_stored_totals(tmp_path, ray_cluster):
    matrix = ("--set", "matrix={workload.num_requests: [3, 5]}")
    db, port = tmp_path / "runs.duckdb", free_port()
    command, env = cli("run", "--headless", "--db", str(db), "--executor", "ray", *matrix,
                       "--metrics-port", str(port), "--metrics-linger", "20",
                       cwd=tmp_path, address=ray_cluster)  # fmt: skip
    stderr = tmp_path / "stderr"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env
        )
    try:
        deadline, scraped = time.monotonic() + 240, None
        while time.monotonic() < deadline and proc.poll() is None:
            landed = LANDED.findall(stderr.read_text())
            if len(landed) == 2:
                scraped = scrape_by_run(port)  # both cells landed: lingering, or about to
                if scraped is not None and set(landed) <= set(scraped):
                    break
            time.sleep(0.2)
        assert scraped is not None, stderr.read_text()[-3000:]
        assert proc.poll() is None  # --metrics-linger keeps serving
        assert proc.wait(timeout=60) == 0, stderr.read_text()[-3000:]  # the linger over
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute(
            "SELECT run_id, status, (SELECT count(*) FROM tokens t WHERE t.run_id = r.run_id), "
            "(SELECT count(*) FROM steps s WHERE s.run_id = r.run_id), "
            "(SELECT count(*) FROM requests q WHERE q.run_id = r.run_id) FROM runs r"
        ).fetchall()
    assert sorted(landed) == sorted(run_id for run_id, *_ in stored)
    assert sorted(scraped) == sorted(landed)  # one set of series per run, none other
    for run_id, status, tokens, steps, requests in stored:
        series = scraped[run_id]
        assert status == "completed" and tokens > 0 and steps > 0
        assert series["vllm:generation_tokens_total"] == tokens
        assert series["mrv2_prof:steps_total"] == steps
        assert series["vllm:time_to_first_token_seconds_count"] == requests
        assert series["mrv2_prof:requests_finished_total"] == requests
    assert sorted(requests for *_, requests in stored) == [3, 5]
