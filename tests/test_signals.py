"""Signals to the CLI process of ``mrv2-prof run`` at random points: it exits with 128 + the
signal (or is killed by it before a run began), no process it started outlives it by more than
a few seconds, the database is free again, and the run is ``aborted`` or ``failed``, never left
``running``."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import duckdb
import pytest

from mrv2_prof.store import Store

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
TAG = "MRV2_SIGNAL_TEST"


def _tagged_processes(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``TAG=tag``."""
    found = []
    needle = f"{TAG}={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


class _Cli:
    """``mrv2-prof run`` in its own session, its stderr lines collected with their time."""

    def __init__(self, db: Path, tag: str) -> None:
        env = {**os.environ, TAG: tag, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "mrv2_prof", "run", str(QUICKSTART), "--db", str(db),
                "--headless", "--set", "workload.num_requests=16",
                "--set", "workload.prompt_len={dist: fixed, value: 8}",
                "--set", "workload.output_len={dist: fixed, value: 900}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.started = threading.Event()  # the runner reported its run id (model loaded)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def wait(self, timeout: float) -> int:
        """The exit code, once every line it wrote to stderr has been read."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            if " run " in line and "quickstart" in line:
                self.started.set()


def _settle(tag: str, db: Path) -> None:
    """No process of the run is left within a few seconds; the database is free again."""
    deadline = time.monotonic() + 20
    while (left := _tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes outlived the CLI: {left}"
    if db.exists():
        Store.open(db, read_only=True, lock_wait_s=0).close()  # nobody holds the lock


def _statuses(db: Path) -> list[tuple[str, str | None]]:
    if not db.exists():
        return []
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT status, error FROM runs").fetchall()


@pytest.mark.parametrize(
    ("signum", "seed"),
    [(signal.SIGTERM, 0), (signal.SIGHUP, 1), (signal.SIGKILL, 2), (signal.SIGKILL, 3)],
    ids=["SIGTERM", "SIGHUP", "SIGKILL-early", "SIGKILL"],
)
def test_a_signal_to_the_cli_at_a_random_point(tmp_path, signum, seed):
    rng = random.Random(seed)
    db, tag = tmp_path / "runs.duckdb", uuid.uuid4().hex
    cli = _Cli(db, tag)
    try:
        if seed == 2:  # anywhere from the CLI's own start-up to the runner's
            time.sleep(rng.uniform(0.2, 6.0))
        else:  # in the step loop
            assert cli.started.wait(120), "".join(cli.lines)
            time.sleep(rng.uniform(0.0, 2.5))
        started = cli.started.is_set()
        for _ in range(1 if signum == signal.SIGKILL else 3):  # more of them change nothing
            os.kill(cli.proc.pid, signum)
            time.sleep(0.05)
        code = cli.wait(timeout=90)
    finally:
        if cli.proc.poll() is None:
            cli.proc.kill()
    _settle(tag, db)
    stderr = "".join(cli.lines)
    assert "Traceback" not in stderr, stderr
    if signum == signal.SIGKILL:
        assert code == -signal.SIGKILL
    elif started:
        assert code == 128 + signum, stderr
    else:
        assert code in (128 + signum, -signum), stderr  # before the CLI handled signals
    statuses = _statuses(db)
    assert all(status in ("aborted", "failed") for status, _ in statuses), statuses
    if started:
        ((status, error),) = statuses
        assert status == "aborted", error
        name = signal.Signals(signum).name
        assert name in error if signum != signal.SIGKILL else "parent process" in error, error


def test_ctrl_c_any_number_of_times_exits_130_and_keeps_the_data(tmp_path):
    """``kill -INT`` of the CLI alone (not its process group), again and again until it has
    exited: during the abort, the summary and the interpreter's teardown."""
    db, tag = tmp_path / "runs.duckdb", uuid.uuid4().hex
    cli = _Cli(db, tag)
    try:
        assert cli.started.wait(120), "".join(cli.lines)
        time.sleep(1.5)  # past a flush
        deadline = time.monotonic() + 90
        while cli.proc.poll() is None and time.monotonic() < deadline:
            os.kill(cli.proc.pid, signal.SIGINT)
            time.sleep(0.02)
        code = cli.wait(timeout=10)
    finally:
        if cli.proc.poll() is None:
            cli.proc.kill()
    _settle(tag, db)
    assert code == 130 and "Traceback" not in "".join(cli.lines), "".join(cli.lines)
    ((status, error),) = _statuses(db)
    assert (status, error) == ("aborted", "interrupted (SIGINT)")
    with duckdb.connect(str(db), read_only=True) as con:
        steps, hi = con.execute("SELECT count(*), max(step) FROM steps").fetchone()
        tokens, outputs = con.execute(
            "SELECT (SELECT count(*) FROM tokens), (SELECT sum(output_tokens) FROM requests)"
        ).fetchone()
    assert steps > 0 and hi == steps - 1 and tokens == outputs


def _runner_of(tag: str) -> int | None:
    """The spawned runner among the tagged processes (not the CLI, not the resource tracker)."""
    for pid in _tagged_processes(tag):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            return pid
    return None


def test_ctrl_c_while_the_runner_imports_is_no_traceback(tmp_path):
    """Ctrl-C to the terminal's process group the moment the runner process exists (it is
    importing): no traceback from either process, exit 130, the run aborted."""
    db, tag = tmp_path / "runs.duckdb", uuid.uuid4().hex
    cli = _Cli(db, tag)
    try:
        deadline = time.monotonic() + 120
        while _runner_of(tag) is None:
            assert time.monotonic() < deadline and cli.proc.poll() is None, "".join(cli.lines)
            time.sleep(0.01)
        os.killpg(cli.proc.pid, signal.SIGINT)
        code = cli.wait(timeout=90)
    finally:
        if cli.proc.poll() is None:
            cli.proc.kill()
    _settle(tag, db)
    stderr = "".join(cli.lines)
    assert code == 130 and "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert _statuses(db) == [("aborted", "interrupted (SIGINT)")]
