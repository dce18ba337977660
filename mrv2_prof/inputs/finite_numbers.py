"""Numbers read from inputs other than the scenario (trace lines, gate thresholds, the nsys start
mark), held to the scenario's own rule and quoted the way its errors quote them.

A scenario section (``scenario.section.Section``, whose config spreads ``NUMBER_RULE``) takes a
float through pydantic's strict float with ``allow_inf_nan=False``: an int or a float, not a
bool or a string, that converts to a finite float. A 400-digit integer is refused there ("Input
should be a valid number") instead of overflowing ``float()``, and JSON's ``1e400`` (inf) as not
finite. ``number_problem`` applies that same validator, so a trace line and a thresholds file
refuse what a ``--set`` refuses (in the words of their other errors: "must be ...");
``shown_number`` quotes a number of any size in at most a few dozen characters.
"""

from __future__ import annotations

import sys
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from mrv2_prof.views.safe_text import shown

# The scenario's rule for numbers: ``scenario.section.Section`` builds its config from it.
NUMBER_RULE = ConfigDict(strict=True, allow_inf_nan=False)
_RULE = NUMBER_RULE
_FLOAT: TypeAdapter[float] = TypeAdapter(float, config=_RULE)
_WIDE = 10**24  # an integer this large or larger is quoted cut, not with every digit


def is_json_number(value: Any) -> bool:
    """An int or a float as JSON and YAML give them (a bool is not a number)."""
    return type(value) in (int, float)


def number_problem(value: Any) -> str | None:
    """Why ``value`` is not a number the scenario would take, with the value quoted; None when
    it is one (pydantic's validator decides, the words are this project's)."""
    try:
        _FLOAT.validate_python(value)
    except ValidationError as exc:
        kind = exc.errors()[0]["type"]
        if kind == "finite_number":
            want = "a finite number"
        elif type(value) is int:  # one that overflows a float
            want = f"a number a float holds (at most {sys.float_info.max:.3g} in size)"
        else:
            want = "a number"
        return f"must be {want}, got {shown_number(value)}"
    return None


def finite(value: Any) -> float | None:
    """``value`` as a finite float when the scenario's rule takes it, else None."""
    return None if number_problem(value) is not None else float(value)


def shown_number(value: Any, grouped: bool = True) -> str:
    """A number quoted in an error: as it is written (with thousands separators when
    ``grouped``), or cut like ``shown`` when it is an integer of more than 24 digits; any other
    value as ``shown`` quotes it."""
    if type(value) is float or (type(value) is int and -_WIDE < value < _WIDE):
        return f"{value:,}" if grouped else str(value)
    return shown(value)
