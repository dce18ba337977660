"""Writing a live run's batches off the step loop: one background thread per run.

The runner process drains its probe buffers about once a second; the DuckDB insert of those
batches (tens of milliseconds) would otherwise stall the step loop and show up in what is being
measured. ``BackgroundWriter`` takes the drained batches from a queue and appends each set in one
transaction. The connection is used by this thread only between ``start()`` and ``close()``;
``close()`` writes whatever is still queued, so an interrupted run loses nothing it drained.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from mrv2_prof.store.db import Store

Batches = Mapping[str, Mapping[str, Any]]

_STOP = object()


class BackgroundWriter:
    def __init__(
        self,
        store: Store,
        run_id: str,
        convert: Callable[[Any], Batches] | None = None,
        release: Callable[[Any], None] | None = None,
    ) -> None:
        """``convert`` runs on the writer thread, off the step loop, before each append: what
        ``submit`` queues can be the probe's own arrays (a buffer swap), turned into batches
        only here. ``release`` gets each submitted item back once it is written (the probe
        reuses its arrays)."""
        self.store, self.run_id = store, run_id
        self._convert = convert
        self._release = release
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="mrv2-store-writer", daemon=True)
        self.error: BaseException | None = None
        self.rows_written = 0

    def start(self) -> BackgroundWriter:
        """Prime the Arrow scan path once (its first use loads code), then start the thread."""
        con = self.store.connection
        con.register("_mrv2_prime", pa.table({"x": pa.array([1], mask=[False])}))
        try:
            con.execute("SELECT count(*) FROM _mrv2_prime").fetchall()
        finally:
            con.unregister("_mrv2_prime")
        self._thread.start()
        return self

    def submit(self, batches: Any) -> None:
        """Queue one drain's batches (or what ``convert`` takes); re-raises a failure of an
        earlier write."""
        if self.error is not None:
            raise self.error
        self._queue.put(batches)

    def _loop(self) -> None:
        while (batches := self._queue.get()) is not _STOP:
            if self.error is None:
                try:
                    item = batches
                    if self._convert is not None:
                        batches = self._convert(item)
                    self.rows_written += self.store.append_batches(self.run_id, batches)
                    del batches
                    if self._release is not None:
                        self._release(item)
                except BaseException as exc:  # surfaced by submit() / close()
                    self.error = exc

    def close(self) -> None:
        """Write everything queued, stop the thread, and re-raise a write failure."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        if self.error is not None:
            raise self.error
