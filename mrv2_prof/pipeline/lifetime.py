"""How a run ends on a signal, and how the runner process ends with its parent.

The parent (the CLI) owns the signals: Ctrl-C (SIGINT), SIGTERM and SIGHUP, any number of
them, ask the runner to stop between two steps; the run is ``aborted`` with everything recorded
kept, and the CLI exits 128 + the signal's number (130, 143, 129). The runner process is spawned
with those signals blocked, so one that arrives while it imports (a Ctrl-C to the terminal's
process group) neither interrupts it with a traceback nor is lost: ``RunnerLifetime`` then
ignores SIGINT and SIGHUP (the parent relays them), turns SIGTERM into a stop, and watches its
parent (``PR_SET_PDEATHSIG`` on Linux and a ``getppid`` poll). When the parent is gone the runner
stops the same way, finishes its row and exits, releasing the database; one that cannot stop
within ``PARENT_GONE_GRACE_S`` exits anyway (its row is then marked ``failed`` by the next
writer, ``store.orphans``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PARENT_GONE_GRACE_S = 30.0
_WATCH_INTERVAL_S = 0.2
_PR_SET_PDEATHSIG = 1
_PARENT_DEATH_SIGNAL = signal.SIGUSR1
_REASONS = {
    signal.SIGINT: "interrupted (SIGINT)",
    signal.SIGTERM: "terminated (SIGTERM)",
    signal.SIGHUP: "hung up (SIGHUP)",
}


def stop_reason(signum: int) -> str:
    """The run's ``error`` when a signal stopped it."""
    return _REASONS.get(signum, f"stopped by signal {signum}")


def exit_code(signum: int) -> int:
    """The shell's convention for a process ended by ``signum``: 128 + its number."""
    return 128 + signum


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Block the stop signals around spawning the runner: the child inherits the mask (it
    unblocks them once its handlers are in place); the parent gets its pending ones after."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class RunnerLifetime:
    """In the runner process: why it should stop (a signal, or its parent gone), and when."""

    def __init__(self, parent_pid: int | None, stop_signal=None) -> None:
        """``stop_signal``: a shared int the parent sets to the signal it relays (0: none)."""
        self.parent_pid = parent_pid
        self._stop_signal = stop_signal
        self.own_signal = 0
        self.parent_gone = False
        self.finished = threading.Event()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(_PARENT_DEATH_SIGNAL, self._on_parent_death)
        _set_parent_death_signal(_PARENT_DEATH_SIGNAL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        if parent_pid is not None:
            self._check_parent()
            threading.Thread(target=self._watch, name="mrv2-parent-watch", daemon=True).start()

    def _on_signal(self, signum, frame) -> None:
        self.own_signal = self.own_signal or signum

    def _on_parent_death(self, signum, frame) -> None:
        self.parent_gone = True

    def _check_parent(self) -> None:
        if os.getppid() != self.parent_pid:
            self.parent_gone = True

    def _watch(self) -> None:
        while not self.parent_gone:
            if self.finished.wait(_WATCH_INTERVAL_S):
                return
            self._check_parent()
        if not self.finished.wait(PARENT_GONE_GRACE_S):
            sys.stderr.flush()
            os._exit(1)  # stuck: the lock goes with the process, the next writer marks the run

    @property
    def flag(self) -> bool:
        """True once the runner should stop (between two steps)."""
        return bool(self.own_signal) or self.parent_gone

    @property
    def signum(self) -> int:
        relayed = self._stop_signal.value if self._stop_signal is not None else 0
        return relayed or self.own_signal

    def reason(self) -> str | None:
        """The aborted run's ``error``; None when it was a plain stop request (``q``)."""
        if self.parent_gone and not self.signum:
            return f"the parent process (PID {self.parent_pid}) is gone"
        return stop_reason(self.signum) if self.signum else None


def _set_parent_death_signal(signum: int) -> None:
    """Linux: have the kernel send ``signum`` when the parent exits (a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the getppid poll still notices
