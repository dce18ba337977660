"""A run's kernel compiles after warm-up, read from the ``compiles`` table.

A compile is a Triton launcher's cache miss (``source = 'triton'``): the first launch of a
kernel with a specialization key it had not met. Start-up's (warm-up, graph capture) are at step
-1 and expected; one after warm-up (``after_warmup``: a step had begun) is a compile a request
paid for. ``late_compiles`` returns those with their count and total time; the findings, the
gate metric ``compiles_after_warmup`` and ``strict`` name them by kernel, step and key.
"""

from __future__ import annotations

from dataclasses import dataclass

from mrv2_prof.store.db import Store


@dataclass(frozen=True)
class Compile:
    step: int
    source: str  # triton | torch
    kernel: str
    key: str  # the specialization key, shortened
    compile_ms: float


@dataclass(frozen=True)
class LateCompiles:
    """The compiles after warm-up, in the order they happened."""

    compiles: tuple[Compile, ...] = ()

    @property
    def count(self) -> int:
        return len(self.compiles)

    @property
    def total_ms(self) -> float:
        return sum(c.compile_ms for c in self.compiles)


def late_compiles(store: Store, run_id: str) -> LateCompiles:
    """The compiles of run ``run_id`` (an exact id) after warm-up."""
    rows = store.connection.execute(
        "SELECT step, source, kernel, key, compile_ms FROM compiles "
        "WHERE run_id = ? AND after_warmup ORDER BY step, t_ns",
        [run_id],
    ).fetchall()
    return LateCompiles(
        tuple(
            Compile(
                int(step), str(source or "?"), str(kernel or "?"), str(key or ""), float(ms or 0)
            )
            for step, source, kernel, key, ms in rows
        )
    )
