"""While ``mrv2-prof run`` writes a long run, ``runs`` and ``show`` (other processes) read the
finished runs of the same database and list the live one as running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mrv2_prof", *args], capture_output=True, text=True, timeout=300
    )


def test_runs_and_show_work_while_another_process_writes_a_run(tmp_path):
    db = tmp_path / "runs.duckdb"
    first = cli("run", str(QUICKSTART), "--headless", "--db", str(db),
                "--set", "workload.num_requests=2")  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    (done_id,) = re.findall(r"run (\w{6}) on", first.stderr)

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    long_run = subprocess.Popen(
        [sys.executable, "-m", "mrv2_prof", "run", str(QUICKSTART), "--db", str(db),
         "--headless", "--set", "workload.num_requests=600",  # arrivals in wall time over
         "--set", "workload.arrival={pattern: poisson, rate: 2}",  # minutes, on any machine
         "--set", "workload.prompt_len={dist: fixed, value: 8}",
         "--set", "workload.output_len={dist: fixed, value: 16}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    live_ids: list[str] = []
    started = threading.Event()

    def read() -> None:
        for line in long_run.stderr:
            live_ids.extend(re.findall(r"run (\w{6}) on", line))
            if live_ids:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(180), "the long run did not start"
        (live_id,) = live_ids
        listed = cli("runs", "--db", str(db))
        assert listed.returncode == 0, listed.stderr
        rows = {line.split()[1]: line for line in listed.stdout.splitlines() if "│" in line}
        assert "completed" in rows[done_id] and "running" in rows[live_id], listed.stdout
        shown = cli("show", done_id, "--db", str(db))
        assert shown.returncode == 0, shown.stderr
        assert done_id in shown.stdout and "TTFT" in shown.stdout
        live = cli("show", live_id, "--db", str(db))
        assert live.returncode == 2 and "is still running" in live.stderr, live.stderr
        assert long_run.poll() is None, "the run ended before the readers were done"
    finally:
        if long_run.poll() is None:
            long_run.send_signal(signal.SIGTERM)
        code = long_run.wait(timeout=120)
        reader.join(timeout=10)
    assert code == 128 + signal.SIGTERM
    after = cli("runs", "--db", str(db))
    rows = {line.split()[1]: line for line in after.stdout.splitlines() if "│" in line}
    assert "aborted" in rows[live_id], after.stdout  # merged into the database as it ended
    assert not (tmp_path / "runs.duckdb.live").exists()
