"""The standby runner (``pipeline/standby.py``): a ``run`` command starts the runner's process
before its own imports and hands it the job. The run is the same as with a runner spawned then
(its tokens, its outcome), its start-up line says so and adds up, and a standby that gets no job
(bad input, Ctrl-C while the command imports, a runner started elsewhere) never outlives the
command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import duckdb
import pytest
from test_signals import TAG, _tagged_processes

from mrv2_prof.pipeline import standby

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "decode_heavy.yaml"
SETS = ["runner.device=cpu", "model.preset=llama-tiny", "workload.num_requests=3",
        "workload.output_len.value=12"]  # fmt: skip


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def gone(tag: str) -> None:
    """The command's standby is gone as soon as the command is (killed and joined before it
    exits, not left to end after its imports), and every other process of it within seconds."""
    time.sleep(0.2)
    assert [p for p in _tagged_processes(tag) if b"spawn_main" in cmdline(p)] == []
    deadline = time.monotonic() + 20  # multiprocessing's resource tracker ends by itself
    while _tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _tagged_processes(tag) == []


def run_cli(*args: str, switch: str, tag: str = "", **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, standby.SWITCH_ENV: switch, TAG: tag or uuid.uuid4().hex}
    return subprocess.run(
        [sys.executable, "-m", "mrv2_prof", *args], capture_output=True, text=True,
        timeout=300, env=env, **kw,
    )  # fmt: skip


def cli_run(db: Path, switch: str, *extra: str) -> subprocess.CompletedProcess:
    sets = [a for s in SETS for a in ("--set", s)]
    return run_cli("run", str(SCENARIO), "--headless", "--db", str(db), *sets, *extra,
                   switch=switch)  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "switch", "driver", "want"),
    [
        (["mrv2-prof", "run", "s.yaml"], "auto", True, True),
        (["mrv2-prof", "run", "s.yaml"], "auto", False, False),  # a CPU host: not by default
        (["mrv2-prof", "run", "s.yaml"], "on", False, True),
        (["mrv2-prof", "run", "s.yaml"], "off", True, False),
        (["mrv2-prof", "run", "--help"], "on", True, False),
        (["mrv2-prof", "show", "latest"], "on", True, False),  # no runner to start
        (["mrv2-prof"], "on", True, False),
        (["mrv2-prof", "run", "s.yaml", "--executor", "ray"], "on", True, False),
        (["mrv2-prof", "run", "--executor=ray", "s.yaml"], "auto", True, False),
    ],
)
def test_wanted_for_a_run_command_where_a_driver_is_or_where_asked(
    argv, switch, driver, want, monkeypatch
):
    monkeypatch.setattr(standby, "cuda_driver_present", lambda: driver)
    assert standby.wanted(argv, {standby.SWITCH_ENV: switch}) is want


def test_a_run_handed_to_the_standby_runner_is_the_run_a_fresh_runner_makes(tmp_path):
    """Same seed, standby on and off: the same tokens for every request, both completed; the
    standby's line names it and its phases add up to its total (command_s, process_start_s
    counted from the hand-over, startup_s)."""
    runs = {}
    for switch in ("on", "off"):
        db = tmp_path / f"{switch}.duckdb"
        done = cli_run(db, switch)
        assert done.returncode == 0, done.stderr[-3000:]
        con = duckdb.connect(str(db), read_only=True)
        (status, command, standby_s, process, startup) = con.execute(
            "SELECT status, info->>'command_s', info->>'standby_s', info->>'process_start_s', "
            "info->>'startup_s' FROM runs"
        ).fetchone()
        tokens = con.execute("SELECT req_id, idx, token_id FROM tokens ORDER BY ALL").fetchall()
        con.close()
        runs[switch] = (status, tokens, command, standby_s, process, startup, done.stdout)
    on, off = runs["on"], runs["off"]
    assert on[0] == off[0] == "completed"
    assert len(on[1]) == 3 * 12 and on[1] == off[1]
    assert off[3] is None and on[3] is not None  # the fact only where a standby took the job
    command, standby_s, process, startup = (float(v) for v in on[2:6])
    assert 0 < standby_s <= command  # started after the command began, before the hand-over
    text = " ".join(on[6].split())
    assert "the runner starting beside it" in text and "the runner starting" not in off[6]
    assert f"start-up {command + process + startup:.1f} s (command {command:.1f} s" in text


def test_a_standby_that_gets_no_job_does_not_outlive_the_command(tmp_path):
    """Bad input (exit 2 before anything is written) and Ctrl-C while the command imports: the
    standby started, and is gone when the command is."""
    tag = uuid.uuid4().hex
    bad = run_cli("run", str(SCENARIO), "--headless", "--db", str(tmp_path / "r.duckdb"),
                  "--set", "runner.max_num_reqs=-3", switch="on", tag=tag)  # fmt: skip
    assert bad.returncode == 2 and "runner.max_num_reqs" in bad.stderr, bad.stderr
    assert not (tmp_path / "r.duckdb").exists()
    gone(tag)
    tag = uuid.uuid4().hex
    env = {**os.environ, standby.SWITCH_ENV: "on", TAG: tag}
    proc = subprocess.Popen([sys.executable, "-m", "mrv2_prof", "run", str(SCENARIO)], env=env,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)  # fmt: skip
    deadline = time.monotonic() + 30
    while not any(b"spawn_main" in cmdline(p) for p in _tagged_processes(tag)):  # it is up
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130, proc.stderr.read()
    gone(tag)


def test_a_standby_is_dismissed_where_the_first_runner_needs_other_devices(monkeypatch):
    """A runner started with another CUDA_VISIBLE_DEVICES (a sweep's device slot) does not take
    the standby, which is then killed: nothing waits on for a job that will not come."""
    monkeypatch.setattr(standby, "_standby", None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    waiting = standby.prespawn()
    try:
        assert waiting.process.is_alive()
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
        assert standby.claim() is None
        assert not waiting.process.is_alive() and waiting.claimed
        assert standby.claim() is None  # and it stays gone
    finally:
        waiting.process.kill()
        waiting.process.join(5)


def test_a_standby_that_died_waiting_is_passed_over_for_a_fresh_runner(monkeypatch):
    """The job cannot be handed to a standby that is gone between its claim and the hand-over:
    ``hand_over`` says so and the launcher spawns a runner as ever (its own queue and process)."""
    from mrv2_prof.pipeline import launcher
    from mrv2_prof.pipeline.job import RunJob

    monkeypatch.setattr(standby, "_standby", None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    waiting = standby.prespawn()
    waiting.process.kill()
    waiting.process.join(5)
    monkeypatch.setattr(waiting.process, "is_alive", lambda: True)  # died after the claim's look
    job = RunJob({"name": "x"}, "", "x", None, "unused.duckdb")
    assert standby.claim() is waiting
    assert standby.hand_over(waiting, job) is False
    spawned = []
    runner = launcher.RunnerProcess(job)
    monkeypatch.setattr(standby, "_standby", None)  # the launcher's claim: nothing waits now
    monkeypatch.setattr(runner.process, "start", lambda: spawned.append(True))
    runner.start()
    assert spawned == [True] and runner.process is not waiting.process
    assert runner.job.prespawned_at is None
