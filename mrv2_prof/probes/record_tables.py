"""The recording probe's tables: interned strings, a record buffer per store table, and their
hand-over to the store.

``RecordTables`` keeps a ``RecordBuffer`` per table (``_buffer``); the probe's hooks write into
them. Strings (phase names, tensor names, sync sites, graph reasons, request ids) are interned to
small integers on the hot path (``intern``) and turned back into strings only when the buffers are
handed over. Each buffer's columns and dtypes come from the store's declaration of its table
(``store.schema.TABLES``, through ``probes.columns``).

A flush is two halves: ``swap`` on the step loop hands over the buffers' own arrays (no copy, no
conversion) with the lists kept beside them (a step's tokens as given, graph captures, request
events), and ``decode`` on the writer thread makes ``{table: {column: array}}`` of it in the
store's column names and types, every string column decoded; ``give_back`` returns the arrays for
reuse. ``drain`` is both at once. ``-1`` in an ``*_ns`` column (and ``None`` in a string column)
means "not measured" and is stored as NULL.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mrv2_prof.probes.api import PHASES
from mrv2_prof.probes.columns import STRING, RecordBuffer, buffer_dtypes, dtypes, from_rows

# Interned ids of the span tracks (after the phase names)
CPU_TRACK, GPU_TRACK = len(PHASES), len(PHASES) + 1
# Kinds of ``Handoff.request_events``
ARRIVED, FIRST_TOKEN, FINISHED = 0, 1, 2


@dataclass
class Handoff:
    """One flush's records, still in the probe's arrays (``RecordTables.swap``)."""

    raw: dict[str, dict[str, np.ndarray]]  # table -> column -> interned / numeric values
    step_tokens: list[tuple[list[str], list[int], int, list[int]]]  # ``step_tokens()`` calls
    captures: list[tuple[str, str, int, float, int, int]]
    # what happened to requests since the last swap, in order: (ARRIVED, req, arrival_ns,
    # prompt_tokens), (FIRST_TOKEN, req, t_ns), (FINISHED, req); interned ids
    request_events: list[tuple[int, ...]] = field(default_factory=list)


class RecordTables:
    """Interned names and the record buffers, and their hand-over; the hooks are a subclass's."""

    def __init__(self) -> None:
        self._names: dict[str, int] = {}
        self._name_list: list[str | None] = []
        for name in (*PHASES, "cpu", "gpu"):  # ids: PHASES indices, then CPU_TRACK, GPU_TRACK
            self.intern(name)
        self._tables: dict[str, RecordBuffer] = {}  # store table -> its buffer
        self._strings: dict[str, list[str]] = {}  # store table -> its string columns
        self._buffers: tuple[RecordBuffer, ...] = ()
        # ``step_tokens()``'s calls, as given, until the hand-over
        self._step_tokens: list[tuple[list[str], list[int], int, list[int]]] = []
        self._num_step_tokens = 0
        self.arrivals: dict[int, tuple[int, int]] = {}  # req → (arrival_ns, prompt_tokens)
        self.first_token: dict[int, int] = {}  # req → first token t_ns
        self._request_events: list[tuple[int, ...]] = []  # ``Handoff.request_events``
        self.captures: list[tuple[str, str, int, float, int, int]] = []  # few: start-up, first use

    def _buffer(
        self,
        table: str,
        capacity: int,
        names: tuple[str, ...] | None = None,
        defaults: dict[str, float] | None = None,
    ) -> RecordBuffer:
        """The buffer of ``table``'s columns (``names``, else all but ``run_id``)."""
        buffer = RecordBuffer(buffer_dtypes(table, names), capacity, defaults)
        self._tables[table] = buffer
        self._buffers = (*self._buffers, buffer)
        types = dtypes(table, buffer.cols)
        self._strings[table] = [name for name, dt in types.items() if dt == STRING]
        return buffer

    # ---- interning ------------------------------------------------------------------------------
    def intern(self, name: str | None) -> int:
        i = self._names.get(name)  # type: ignore[arg-type]
        if i is None:
            i = self._names[name] = len(self._name_list)  # type: ignore[index]
            self._name_list.append(name)
        return i

    def name_of(self, name_id: int) -> str | None:
        """The name interned as ``name_id`` (``intern``'s inverse)."""
        return self._name_list[name_id]

    # ---- handing over --------------------------------------------------------------------------
    @property
    def fill(self) -> float:
        """The fullest buffer's fill fraction; flush before it reaches 1 to avoid growing."""
        step_tokens = self._num_step_tokens / self._tables["tokens"].capacity
        return max(step_tokens, *[b.n / b.capacity for b in self._buffers])

    def swap(self) -> Handoff:
        """Everything recorded since the last hand-over, as the buffers' own arrays (no copy,
        no conversion: the step loop's part of a flush); ``decode`` makes store tables of it."""
        raw = {table: buffer.swap() for table, buffer in self._tables.items()}
        step_tokens, self._step_tokens, self._num_step_tokens = self._step_tokens, [], 0
        captures, self.captures = self.captures, []
        events, self._request_events = self._request_events, []
        return Handoff(raw, step_tokens, captures, events)

    def give_back(self, handoff: Handoff) -> None:
        """The hand-over's arrays are written to the store: the next swaps reuse them."""
        for table, cols in handoff.raw.items():
            self._tables[table].give_back(cols)

    def decode(self, handoff: Handoff) -> dict[str, dict[str, np.ndarray]]:
        """A hand-over as store tables, every string column decoded (on the writer thread)."""
        names = np.array([*self._name_list, None], dtype=object)  # ids only grow: a copy is safe
        out: dict[str, dict[str, np.ndarray]] = {}
        for table, cols in handoff.raw.items():
            cols = dict(cols)
            if table == "spans":  # host spans have no starved time (NULL)
                starved = cols["starved_ns"].copy()
                starved[cols["track"] == CPU_TRACK] = -1
                cols["starved_ns"] = starved
            for name in self._strings[table]:
                cols[name] = names[cols[name]]
            out[table] = cols
        if handoff.step_tokens:
            tokens, steps = out["tokens"], handoff.step_tokens
            new = {
                "req_id": np.array([r for s in steps for r in s[0]], dtype=object),
                "idx": np.array([n for s in steps for n in s[1]], dtype=np.int32),
                "t_ns": np.repeat([s[2] for s in steps], [len(s[0]) for s in steps]),
                "token_id": np.array([t for s in steps for t in s[3]], dtype=np.int32),
            }
            for name, col in new.items():
                tokens[name] = np.concatenate([tokens[name], col.astype(tokens[name].dtype)])
        if handoff.captures:
            out["graph_captures"] = from_rows("graph_captures", handoff.captures)
        return out

    def drain(self) -> dict[str, dict[str, np.ndarray]]:
        """Everything recorded since the last drain, as store tables; the buffers are reset."""
        return self.decode(self.swap())

    def unfinished(self) -> list[str]:
        """Requests that arrived and never finished (for the end of an interrupted run)."""
        return [self._name_list[r] for r in self.arrivals]  # type: ignore[misc]
