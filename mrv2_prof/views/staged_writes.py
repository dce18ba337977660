"""The staged-writes line of the summary and the report: the bytes the writes moved against
dense copies and, with ``runner.staged_writes: false``, which tensors were still staged.

With staged writes off, the persistent per-request tensors (block table, computed tokens) are
copied whole every step, but tensors that only ever take a ragged write (the prefill tokens)
keep their staged path; a tensor whose bytes moved are below its dense bytes was staged.
"""

from __future__ import annotations

from collections.abc import Sequence

from mrv2_prof.views.format import format_bytes

TensorBytes = tuple[str, int, int]  # tensor, staged bytes, dense bytes


def staged_writes_text(
    staged_bytes: int,
    dense_bytes: int,
    by_tensor: Sequence[TensorBytes] = (),
    staged_writes: bool | None = None,
) -> str:
    """``moved vs dense``; with ``staged_writes`` False, the tensors copied dense and those
    still staged, each group with its bytes."""
    text = f"{format_bytes(staged_bytes)} moved vs {format_bytes(dense_bytes)} for dense copies"
    if staged_writes is not False or not by_tensor:
        return text
    still = [t for t in by_tensor if t[1] < t[2]]
    dense = [t for t in by_tensor if t[1] >= t[2]]
    parts = []
    if dense:
        moved = sum(t[1] for t in dense)
        parts.append(f"copied dense: {', '.join(t[0] for t in dense)} ({format_bytes(moved)})")
    if still:
        moved, whole = sum(t[1] for t in still), sum(t[2] for t in still)
        parts.append(
            f"still staged: {', '.join(t[0] for t in still)} "
            f"({format_bytes(moved)} vs {format_bytes(whole)} dense)"
        )
    return f"{text}; runner.staged_writes off, {'; '.join(parts)}"
