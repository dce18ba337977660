"""``run``'s checks of two option values, before anything is written (one line, exit 2): a
flag given a value (``--headless true``: the flags take none, so ``true`` came as the SCENARIO)
and ``--heartbeat``'s seconds."""

from __future__ import annotations

from pathlib import Path

from mrv2_prof.cli.console import fail

_BOOL_WORDS = ("true", "false", "yes", "no", "on", "off", "1", "0")


def refuse_a_flag_value(scenario_file: Path | None) -> None:
    """``run --headless true``: the flags take no value, so ``true`` came as the SCENARIO;
    a file of that name is still a scenario."""
    if scenario_file is None or scenario_file.exists():
        return
    if str(scenario_file).lower() in _BOOL_WORDS:
        fail(
            f"SCENARIO {str(scenario_file)!r}: --headless and --strict are flags and take no "
            "value (write --headless, not --headless true)"
        )


HEARTBEAT_MAX_S = 86_400.0  # a day: a longer interval is a typo (0 turns the lines off)


def heartbeat_seconds(text: str) -> float:
    """``--heartbeat``'s seconds, refused in one line (exit 2) unless a finite number in
    [0, HEARTBEAT_MAX_S]."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 <= seconds <= HEARTBEAT_MAX_S:  # NaN fails too
        fail(
            f"--heartbeat {text!r}: expected seconds between progress lines, a number from 0 "
            f"(none) to {HEARTBEAT_MAX_S:,.0f}"
        )
    return seconds
