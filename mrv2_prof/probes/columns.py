"""Numpy columns of the store's tables, typed from the store's one declaration of them.

``store.schema.TABLES`` declares every table's columns (name and DuckDB type) once; what the
probes hand over is derived from it here: the numpy dtype of each column (``dtypes``), rows
turned into columns (``from_rows``), and ``RecordBuffer``, the preallocated growable columns the
recording probe writes into. A ``VARCHAR`` column is an object array of ``str`` / ``None`` once
handed over; inside a ``RecordBuffer`` it holds ids of strings interned by the probe.

The declaration lives in ``store`` (plain data, no torch) because it is the contract of the
database file; the probes conform to it and the store never imports the probes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from mrv2_prof.store.schema import TABLES

STRING = np.dtype(object)  # a VARCHAR column handed over: str / None
STRING_ID = np.dtype(np.int32)  # a VARCHAR column inside a RecordBuffer: interned string ids
_NUMPY = {
    "BIGINT": np.dtype(np.int64),
    "INTEGER": np.dtype(np.int32),
    "DOUBLE": np.dtype(np.float64),
    "BOOLEAN": np.dtype(np.bool_),
    "VARCHAR": STRING,
}


def dtypes(table: str, names: Iterable[str] | None = None) -> dict[str, np.dtype]:
    """``{column: numpy dtype}`` of ``table``, in table order (or in the order of ``names``);
    ``run_id`` is left out: the store fills it in."""
    types = dict(TABLES[table])
    if names is None:
        names = [name for name in types if name != "run_id"]
    return {name: _NUMPY[types[name]] for name in names}


def buffer_dtypes(table: str, names: Iterable[str] | None = None) -> dict[str, np.dtype]:
    """``dtypes`` with every string column as interned ids (``STRING_ID``)."""
    return {name: STRING_ID if dt == STRING else dt for name, dt in dtypes(table, names).items()}


def from_rows(table: str, rows: Sequence[Sequence[Any]]) -> dict[str, np.ndarray]:
    """Rows holding every column of ``table`` but ``run_id`` (in table order), as columns."""
    types = dtypes(table)
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(types)
    return {
        name: np.array(col, dtype=dt) for (name, dt), col in zip(types.items(), cols, strict=True)
    }


class FilledColumns(Mapping):
    """The first ``n`` rows of a set of column arrays, handed over by ``RecordBuffer.swap``:
    a column is sliced when it is read (on the writer thread), never on the step loop."""

    __slots__ = ("arrays", "n", "views")

    def __init__(
        self, arrays: dict[str, np.ndarray], n: int, views: SimpleNamespace | None = None
    ) -> None:
        self.arrays, self.n, self.views = arrays, n, views

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name][: self.n]

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)


class RecordBuffer:
    """Columns of one record type in preallocated arrays; ``n`` rows are valid.

    A column with a default (``defaults``) holds it in every row not written: a hook leaves
    the column alone when its value is the default. Arrays given back are reset to their
    defaults by ``give_back`` (on the writer thread), never on the step loop.

    ``buffer.w`` holds a memoryview of each current array (``buffer.w.start_ns[i] = t``): a
    write through it costs about two thirds of a numpy scalar assignment. The views are made
    once per set of arrays and travel with it through swaps."""

    def __init__(
        self, columns: dict[str, Any], capacity: int, defaults: dict[str, float] | None = None
    ) -> None:
        self.capacity = capacity
        self.n = 0
        self._defaults = defaults or {}
        self._dtypes = dict(columns)
        self.cols = self._new_arrays(capacity)
        self.w = _views(self.cols)
        # Arrays to continue in after a swap, with their views: one set from the start
        # (np.zeros maps its pages only when written), then the sets given back.
        spare = self._new_arrays(capacity)
        self._spare = [(spare, _views(spare))]
        self._empty = FilledColumns(
            {name: np.zeros(0, dtype=col.dtype) for name, col in self.cols.items()}, 0
        )
        vars(self).update(self.cols)  # each column is an attribute: ``buffer.start_ns[i]``

    def _new_arrays(self, capacity: int) -> dict[str, np.ndarray]:
        defaults = self._defaults
        return {
            name: np.full(capacity, defaults[name], dtype=dt)
            if name in defaults
            else np.zeros(capacity, dtype=dt)
            for name, dt in self._dtypes.items()
        }

    def reserve(self, k: int = 1) -> int:
        """Index of the next row, making room for ``k`` rows (doubling when full)."""
        n = self.n
        if n + k > self.capacity:
            self.capacity = max(2 * self.capacity, n + k)
            grown_set = self._new_arrays(self.capacity)
            for name, col in self.cols.items():
                grown = grown_set[name]
                grown[:n] = col[:n]
                self.cols[name] = grown
                setattr(self, name, grown)
            self.w = _views(self.cols)
        return n

    @property
    def fill(self) -> float:
        return self.n / self.capacity

    def swap(self) -> Mapping[str, np.ndarray]:
        """The ``n`` valid rows, handed over as they are (no copy, no slicing: a
        ``FilledColumns``): the buffer continues in a spare set of arrays (``give_back``), or
        fresh ones, of the same capacity. The handed-over arrays are never written again
        until they are given back."""
        if self.n == 0:  # nothing to hand over: the same empty columns every time
            return self._empty
        out = FilledColumns(self.cols, self.n, self.w)
        spare, views = self._spare.pop() if self._spare else (None, None)
        if spare is None or len(next(iter(spare.values()))) != self.capacity:
            spare = self._new_arrays(self.capacity)
            views = _views(spare)
        self.cols, self.w = spare, views
        vars(self).update(spare)
        self.n = 0
        return out

    def give_back(self, handed: Mapping[str, np.ndarray]) -> None:
        """Return arrays ``swap`` handed over, once nothing reads them any more (from any
        thread): the next swap continues in them instead of allocating. Arrays of another
        capacity (the buffer grew since) are dropped."""
        if not isinstance(handed, FilledColumns) or handed is self._empty:
            return
        arrays = handed.arrays
        if len(arrays) == len(self.cols) and all(len(c) == self.capacity for c in arrays.values()):
            for name, value in self._defaults.items():
                arrays[name][: handed.n] = value
            views = handed.views if handed.views is not None else _views(arrays)
            self._spare.append((arrays, views))

    def take(self) -> dict[str, np.ndarray]:
        out = {name: col[: self.n].copy() for name, col in self.cols.items()}
        self.n = 0
        return out


def _views(arrays: dict[str, np.ndarray]) -> SimpleNamespace:
    return SimpleNamespace(**{name: memoryview(a) for name, a in arrays.items()})
