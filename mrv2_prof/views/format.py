"""Text formatting of values for every view: the dashboard, the run browser, the summary and the
report (plain functions: no rich, no Textual; ``—`` where nothing was measured)."""

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


NOT_ON_CPU = "n/a on CPU"


def format_ns_ms(ns: int | None) -> str:
    """A nanosecond duration shown in milliseconds (``format_ms``)."""
    return format_ms(None if ns is None else ns / 1e6)


def format_ms_pair(p50: float | None, p99: float | None) -> str:
    """``12.5 / 80.2 ms`` (p50 / p99, the unit once); ``—`` for a missing side."""
    if p50 is None and p99 is None:
        return NO_VALUE
    a, b = (NO_VALUE if v is None else format_ms(v).removesuffix(" ms") for v in (p50, p99))
    return f"{a} / {b} ms"


def format_share(n: int, total: int) -> str:
    """``n`` as a percentage of ``total``; ``—`` when the total is 0."""
    return format_percent(n / total if total else None)


def format_site(site: str) -> str:
    """A sync site without its directories: ``mrv2_prof/runner/x.py:12`` → ``x.py:12``."""
    return site.rsplit("/", 1)[-1]


def format_counts(pairs: tuple[tuple[str, int], ...] | list[tuple[str, int]]) -> str:
    """``full 380, none 12``; ``—`` when empty."""
    return ", ".join(f"{name} {format_count(n)}" for name, n in pairs) or NO_VALUE


def gpu_only(device: str, text: str | None) -> str:
    """``text``, or why there is none: ``n/a on CPU`` on a CPU run, else ``—`` (not yet)."""
    if text is not None:
        return text
    return NOT_ON_CPU if device.startswith("cpu") else NO_VALUE


def one_line(exc: BaseException) -> str:
    """An error as one line (the first line of its message, else its type)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
