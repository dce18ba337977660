"""``ScenarioError``: every problem with a scenario as one line, ``<file>: <field>: <problem>``,
including pydantic's validation errors, reworded in the names users type."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from mrv2_prof.scenario.keys import did_you_mean
from mrv2_prof.scenario.section import RUN_SEED_LIMIT, SEED_LIMIT, FieldError
from mrv2_prof.scenario.workload_section import DIST_TAGS
from mrv2_prof.views.safe_text import plain, shown


class ScenarioError(ValueError):
    """A scenario that cannot be used; ``str()`` is one line: ``<file>: <field>: <problem>``."""

    def __init__(self, file: str, field: str, problem: str) -> None:
        self.file, self.field = plain(str(file), limit=300), plain(field, limit=120)
        self.problem = " ".join(plain(problem, limit=600).split())
        where = f"{self.file}: {self.field}: " if field else f"{self.file}: "
        super().__init__(where + self.problem)


_RUN_SEED_WHY = "2^31: per-request seeds are derived as seed * 2^32 + a hash, in 64 bits"
_REASONS = {("<", RUN_SEED_LIMIT): _RUN_SEED_WHY, ("<", SEED_LIMIT): "2^63: a signed 64-bit seed"}
_BOUNDS = {
    "greater_than_equal": ">=",
    "greater_than": ">",
    "less_than_equal": "<=",
    "less_than": "<",
}
_BOUND_KEYS = {">=": "ge", ">": "gt", "<=": "le", "<": "lt"}


def _problem(err: dict[str, Any]) -> str:
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    if kind in _BOUNDS:
        op = _BOUNDS[kind]
        bound = ctx.get(_BOUND_KEYS[op])
        reason = _REASONS.get((op, bound))
        why = f" ({reason})" if reason else ""
        return f"must be {op} {bound}, got {shown(got)}{why}"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required"
    if kind == "union_tag_invalid":
        return f"unknown dist {shown(ctx.get('tag'))}, expected one of {ctx.get('expected_tags')}"
    if kind == "union_tag_not_found":
        return "missing 'dist' (fixed, uniform, normal, lognormal)"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return f"{err['msg']}, got {shown(got)}"


def to_scenario_error(
    exc: ValidationError, file: str, root: type[BaseModel] | None = None
) -> ScenarioError:
    """The first of pydantic's errors, at the dotted key a user would type; an unknown key of
    ``root``'s schema says the valid key it is closest to, if any."""
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        loc.append(cause.field)
    # Discriminated unions add the tag to the location; users never type it.
    loc = [p for i, p in enumerate(loc) if not (p in DIST_TAGS and i and "len" in loc[i - 1])]
    key, problem = ".".join(loc), _problem(err)
    if err["type"] == "extra_forbidden" and root is not None:
        problem += did_you_mean(root, key)
    return ScenarioError(file, key, problem)
