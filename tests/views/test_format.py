from __future__ import annotations

import pytest

from mrv2_prof.views.format import (
    format_bytes,
    format_duration,
    format_ms,
    format_percent,
    staged_ratio,
)


@pytest.mark.parametrize(
    ("num_bytes", "expected"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (3 * 2**19, "1.5 MiB"),
        (5 * 2**40, "5.0 TiB"),
    ],
)
def test_format_bytes(num_bytes: int, expected: str) -> None:
    assert format_bytes(num_bytes) == expected


@pytest.mark.parametrize(
    ("ms", "expected"),
    [(None, "—"), (0.1234, "0.12 ms"), (12.34, "12.3 ms"), (1234.5, "1,234 ms")],
)
def test_format_ms(ms: float | None, expected: str) -> None:
    assert format_ms(ms) == expected


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0.0, "0.0 s"), (59.94, "59.9 s"), (75.0, "1m 15s"), (3723.0, "1h 02m 03s")],
)
def test_format_duration(seconds: float, expected: str) -> None:
    assert format_duration(seconds) == expected


def test_staged_ratio_and_percent() -> None:
    assert staged_ratio(1, 4) == 0.25
    assert staged_ratio(10, 0) is None
    assert format_percent(staged_ratio(1, 4)) == "25.0 %"
    assert format_percent(None) == "—"
