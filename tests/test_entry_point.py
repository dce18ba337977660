"""The ``mrv2-prof`` entry point, run as a real process: a closed pipe, a full disk, a stdout that
cannot encode, Ctrl-C while the command line is still being imported, click's errors and an
unexpected exception all end with at most one line on stderr and a conventional exit code."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mrv2_prof import cli
from mrv2_prof.cli import main_entry

TIMEOUT_S = 120
ENTRY = [sys.executable, "-m", "mrv2_prof"]
SCRIPT = shutil.which("mrv2-prof", path=str(Path(sys.executable).parent))
LABEL = "µs × — ünïcode"


def no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert "Exception ignored" not in stderr, stderr


def env(**extra: str) -> dict[str, str]:
    values = {k: v for k, v in os.environ.items() if k != "MRV2_PROF_DEBUG"}
    return values | {"COLUMNS": "120"} | extra


@pytest.fixture(scope="module")
def many_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database of 400 runs labelled with non-ASCII text (``runs`` prints about 55 kB)."""
    from mrv2_prof.store import Store

    path = tmp_path_factory.mktemp("many") / "runs.duckdb"
    with Store.open(path) as store:
        for i in range(400):
            store.begin_run(
                f"r{i:05d}",
                scenario_name="s",
                label=f"{LABEL} {i}",
                matrix_combo=None,
                scenario_yaml="name: s\n",
                device="cpu",
                versions={},
                started_ns=10**18 + i,
                info=None,
            )
    return path


def test_the_console_script_is_the_light_entry_point() -> None:
    assert SCRIPT is not None, "mrv2-prof is not installed beside this interpreter"
    text = Path(SCRIPT).read_text()
    assert "from mrv2_prof.__main__ import main" in text, text


def test_the_exception_classes_are_the_ones_typer_raises() -> None:
    assert issubclass(cli.NoArgsIsHelpError, cli.UsageError)
    assert issubclass(cli.UsageError, cli.ClickException)
    assert cli.Abort is __import__("typer").Abort
    with pytest.raises(cli.UsageError):
        cli.app(prog_name="mrv2-prof", args=["--no-such-option"], standalone_mode=False)


def test_a_usage_error_in_process_is_one_line_and_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main_entry(["runs", "--no-such-option"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "error: No such option: --no-such-option (see 'mrv2-prof runs --help')"
    ]


@pytest.mark.parametrize("entry", ["script", "module"])
def test_a_usage_error_is_one_line_and_exit_2(entry: str) -> None:
    command = [SCRIPT] if entry == "script" else ENTRY
    done = subprocess.run(
        [*command, "show", "--bogus"], capture_output=True, text=True, timeout=TIMEOUT_S, env=env()
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: No such option: --bogus (see 'mrv2-prof show --help')"
    ]


def test_bare_mrv2_prof_prints_help_on_stderr_and_exits_2() -> None:
    done = subprocess.run(ENTRY, capture_output=True, text=True, timeout=TIMEOUT_S, env=env())
    assert done.returncode == 2
    assert "Usage: mrv2-prof" in done.stderr
    no_traceback(done.stderr)


def test_a_pipe_closed_before_anything_is_written_ends_quietly_with_141() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [SCRIPT, "run", "--help"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT_S,
            env=env(),
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


def test_a_reader_that_stops_after_one_line_ends_it_quietly(many_db: Path) -> None:
    """``mrv2-prof runs | head -1``: 141 when the next write found the pipe closed, 0 when
    everything was written before (the kernel drops a write cut short by the close)."""
    proc = subprocess.Popen(
        [SCRIPT, "runs", "--db", str(many_db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(),
    )
    try:
        first = proc.stdout.readline()
        proc.stdout.close()
        code = proc.wait(TIMEOUT_S)
        stderr = proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.wait()
    assert first.startswith(b"runs in ")
    assert code in (0, 141), stderr
    assert stderr == ""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("args", [["show", "latest"], ["runs"], ["--help"]])
def test_a_full_stdout_is_one_line_and_exit_1(args: list[str], base_db: Path) -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [SCRIPT, *args, *(["--db", str(base_db)] if args[0] != "--help" else [])],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT_S,
            env=env(),
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == ["error: cannot write to stdout: No space left on device"]


@pytest.mark.parametrize("encoding", ["ascii", "latin-1", "ascii:strict"])
def test_a_stdout_that_cannot_encode_the_output_degrades(encoding: str, many_db: Path) -> None:
    done = subprocess.run(
        [*ENTRY, "runs", "--db", str(many_db)],
        capture_output=True,
        timeout=TIMEOUT_S,
        env=env(PYTHONIOENCODING=encoding, PYTHONUTF8="0"),
    )
    no_traceback(done.stderr.decode(errors="replace"))
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    lines = done.stdout.decode("latin-1").splitlines()
    assert len([line for line in lines if " 399 " in line]) == 1
    row = next(line for line in lines if " 399 " in line)
    if encoding == "latin-1":  # the em dash is not in latin-1
        assert "µs × ? ünïcode 399" in row
    else:
        assert "?s ? ? ?n?code 399" in row


def test_a_file_name_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    db = bytes(tmp_path) + b"/\xff.duckdb"  # decoded with a lone surrogate
    done = subprocess.run(
        [*ENTRY, "runs", "--db", db],
        capture_output=True,
        timeout=TIMEOUT_S,
        env=env(PYTHONIOENCODING="utf-8"),
    )
    no_traceback(done.stderr.decode(errors="replace"))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert b"\\udcff.duckdb: the name is not valid UTF-8" in done.stderr


def _loaded(pid: int, marker: str) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
@pytest.mark.parametrize("entry", ["script", "module"])
def test_ctrl_c_while_importing_is_interrupted_and_exit_130(entry: str) -> None:
    """SIGINT once the heavy imports are under way (DuckDB's library is mapped, torch is still
    to come): ``interrupted``, exit 130, no traceback. Tried a few times, in case a run ends
    before the signal lands."""
    command = [SCRIPT] if entry == "script" else ENTRY
    for _ in range(3):
        proc = subprocess.Popen(
            [*command, "runs", "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if _loaded(proc.pid, "_duckdb") or _loaded(proc.pid, "libtorch"):
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
        if proc.returncode == 0:
            continue  # finished before the signal
        assert proc.returncode == 130, stderr
        assert stderr.splitlines() == ["interrupted"], stderr
        assert stdout == ""
        return
    pytest.fail("the command always finished before SIGINT")


def test_ctrl_c_at_once_never_prints_a_traceback_from_mrv2_prof() -> None:
    """SIGINT 0.1 s after the start: wherever it lands in the entry point, no traceback."""
    proc = subprocess.Popen(
        [*ENTRY, "runs", "--help"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=TIMEOUT_S)
    if proc.returncode != 0:
        assert proc.returncode == 130, stderr
        assert stderr.splitlines() == ["interrupted"], stderr


BOOM = """
import sys
import mrv2_prof.cli.stored as stored

def boom(*args, **kwargs):
    raise RuntimeError("boom\\nsecond line")

stored.render_runs = boom
from mrv2_prof.__main__ import main
sys.argv = ["mrv2-prof", "runs", "--db", sys.argv[1]]
main()
"""


def test_an_unexpected_exception_is_one_line_and_exit_1(base_db: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BOOM, str(base_db)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env(),
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "error: internal error: RuntimeError: boom second line "
        "(re-run with MRV2_PROF_DEBUG=1 for the traceback)"
    ]


def test_mrv2_prof_debug_shows_the_traceback(base_db: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BOOM, str(base_db)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env(MRV2_PROF_DEBUG="1"),
    )
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "RuntimeError: boom" in done.stderr


def test_abort_from_a_command_is_interrupted_and_130(base_db: Path, monkeypatch, capsys) -> None:
    import typer

    import mrv2_prof.cli.stored as stored

    def abort(*args, **kwargs):
        raise typer.Abort()

    monkeypatch.setattr(stored, "render_runs", abort)
    with pytest.raises(SystemExit) as exit_info:
        main_entry(["runs", "--db", str(base_db)])
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.splitlines() == ["interrupted"]
