"""Notes on the workload values a run could not honour as given, one line each, recorded with
the run's other notes (``runs.info['notes']``) and printed with them.

Synthetic lengths are cut to fit ``runner.max_model_len`` rather than refused (a length
distribution's tail may cross it; a trace line's explicit length that does not fit is refused
instead): an output length to leave a prompt token, a prompt to leave its request's output, a
shared prefix to leave a token of the request's own, a repeated segment to a prompt's own
tokens. A prompt drawn shorter than its shared prefix is made longer. A trace asked for more
requests than it holds runs what it holds; keys a trace or a dataset does not use are named.
"""

from __future__ import annotations

import numpy as np

from mrv2_prof.scenario import FixedLen, LengthDist, WorkloadSection

# The keys a trace (every one) or a dataset (the first three) takes no value from.
TRACE_UNUSED = ("prompt_len", "shared_prefix", "repeated_segment_len", "arrival", "output_len",
                "abort_fraction")  # fmt: skip
DATASET_UNUSED = TRACE_UNUSED[:3]


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" if n == 1 else f"{n:,} {what}s"


def _span(values: np.ndarray) -> str:
    low, high = int(values.min()), int(values.max())
    return _count(low, "token") if low == high else f"{low:,} to {high:,} tokens"


def changed_note(
    field: str, given: int | LengthDist, drawn: np.ndarray, kept: np.ndarray, why: str
) -> str | None:
    """A note when some requests' ``kept`` values differ from their ``drawn`` ones: what the
    value was (``given``: a number, or a distribution, whose fixed value is shown), what those
    requests got instead (cut, or raised), in how many, and ``why``; None when all were kept."""
    changed = drawn != kept
    count = int(changed.sum())
    if count == 0:
        return None
    if isinstance(given, FixedLen):
        given = given.value
    what = f"{given:,}" if isinstance(given, int) else "drawn lengths"
    way = "raised" if bool((kept[changed] > drawn[changed]).all()) else "cut"
    return (
        f"{field}: {what} {way} to {_span(kept[changed])} in {count:,} of "
        f"{_count(len(drawn), 'request')} ({why})"
    )


def unused_keys_note(section: WorkloadSection) -> str | None:
    """A note naming the keys a trace or a dataset does not use that the section sets to other
    than their default."""
    keys, source = (TRACE_UNUSED, "trace") if section.trace else (DATASET_UNUSED, "dataset")
    fields = WorkloadSection.model_fields
    unused = [f"workload.{k}" for k in keys if getattr(section, k) != fields[k].get_default()]
    if not unused:
        return None
    return f"{', '.join(unused)}: set, but not used with a {source}"


def trace_count_note(asked: int | None, held: int) -> str | None:
    """A note when ``workload.num_requests`` asks a trace for more requests than it holds."""
    if asked is None or asked <= held:
        return None
    return f"workload.num_requests: {asked:,} asked, the trace holds {_count(held, 'request')}"
