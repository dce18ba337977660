"""Text formatting of snapshot values for the dashboard (plain functions, no Textual)."""

from __future__ import annotations

NO_VALUE = "—"

_BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_count(n: int) -> str:
    return f"{n:,}"


def format_rate(per_s: float, decimals: int = 1) -> str:
    return f"{per_s:,.{decimals}f}"


def format_ms(ms: float | None) -> str:
    """A latency in milliseconds with about three significant digits; ``—`` when not measured."""
    if ms is None:
        return NO_VALUE
    decimals = 2 if ms < 10 else 1 if ms < 1000 else 0
    return f"{ms:,.{decimals}f} ms"


def format_percent(fraction: float | None) -> str:
    if fraction is None:
        return NO_VALUE
    return f"{fraction * 100:.1f} %"


def format_bytes(num_bytes: int) -> str:
    """Binary units: ``512 B``, ``1.5 KiB``, ``48.0 MiB``."""
    if num_bytes < 1024:
        return f"{num_bytes} B"
    value = float(num_bytes)
    for unit in _BYTE_UNITS:
        value /= 1024
        if value < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{value:,.1f} {unit}"
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """``12.3 s`` below a minute, then ``4m 05s`` and ``1h 02m 03s``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    total = int(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    return f"{minutes}m {secs:02d}s"


def staged_ratio(staged_bytes: int, dense_bytes: int) -> float | None:
    """Bytes the staged writes moved per byte a dense copy would have moved; None before any."""
    return staged_bytes / dense_bytes if dense_bytes else None
