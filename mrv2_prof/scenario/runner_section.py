"""The scenario's ``runner:`` section, derived from ``RunnerConfig``'s fields: the same names,
defaults and rules, declared once in ``mrv2_prof.runner.config``.

Each field becomes a pydantic field of the declared type (its ``Literal`` choices, its bounds as
``Field(ge=..)``); a field whose None means "derived at start-up" is spelled ``auto`` here
(``num_kv_blocks: auto``), and a tuple is a YAML list. The rules between fields are
``RunnerConfig``'s own: the section builds one, and its error names the field at fault.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Literal, Union

from pydantic import Field, ValidationInfo, create_model, field_validator, model_validator

from mrv2_prof.runner.config import FIELD_TYPES, Bounds, ConfigError, RunnerConfig
from mrv2_prof.scenario.section import FieldError, Section
from mrv2_prof.scenario.spec_decode_section import SpecDecodeSection
from mrv2_prof.views.safe_text import shown

_FIELDS = {
    f.name: f for f in dataclasses.fields(RunnerConfig) if f.metadata.get("in_scenario", True)
}
AUTO_FIELDS = tuple(name for name, f in _FIELDS.items() if f.metadata.get("auto"))


def _bounds(name: str) -> Bounds:
    return _FIELDS[name].metadata.get("bounds", Bounds())


def _item_type(name: str) -> tuple[Any, bool]:
    """An ``auto`` field's value type without None, and whether it is a list (a tuple here)."""
    (inner,) = (a for a in typing.get_args(FIELD_TYPES[name]) if a is not type(None))
    if typing.get_origin(inner) is tuple:
        return list[typing.get_args(inner)[0]], True
    return inner, False


def _scenario_field(name: str) -> tuple[Any, Any]:
    """``(annotation, default)`` of one runner field in the scenario."""
    f = _FIELDS[name]
    if name in AUTO_FIELDS:  # default "auto" unless the runner's default is a value
        default = "auto" if f.default is None else f.default
        return Union[_item_type(name)[0], Literal["auto"]], default  # noqa: UP007
    bounds = _bounds(name).given()
    hint = FIELD_TYPES[name]
    return (Annotated[hint, Field(**bounds)] if bounds else hint), f.default


_RunnerFields = create_model(
    "_RunnerFields", __base__=Section, **{name: _scenario_field(name) for name in _FIELDS}
)


class RunnerSection(_RunnerFields):
    """``runner:`` of a scenario; ``to_runner_config`` is the one bridge to the runner."""

    spec_decode: SpecDecodeSection = SpecDecodeSection()

    @field_validator(*AUTO_FIELDS, mode="before")
    @classmethod
    def _auto_or_in_bounds(cls, v: Any, info: ValidationInfo) -> Any:
        bounds, (item, is_list) = _bounds(info.field_name), _item_type(info.field_name)
        if item is bool:  # a switch that auto turns on where the run can take it
            if v != "auto" and type(v) is not bool:
                raise ValueError(f"must be 'auto', true or false, got {shown(v)}")
            return v
        items = v if is_list and isinstance(v, list) else [v]
        ok = isinstance(v, list) == is_list and all(
            type(x) is int and bounds.problem(x) is None for x in items
        )
        if v != "auto" and not ok:
            want = (
                f"a list of integers {bounds.text()}" if is_list else f"an integer {bounds.text()}"
            )
            raise ValueError(f"must be 'auto' or {want}, got {shown(v)}")
        return v

    @model_validator(mode="after")
    def _between_fields(self) -> RunnerSection:
        try:
            self.to_runner_config(seed=0)
        except ConfigError as exc:
            raise FieldError(exc.field or "", exc.problem) from None
        return self

    def to_runner_config(self, seed: int) -> RunnerConfig:
        """The runner's own config (``auto`` values become None, lists tuples)."""
        kwargs = self.model_dump(exclude={"spec_decode"})
        kwargs["spec_decode"] = self.spec_decode.to_config()
        for name in AUTO_FIELDS:
            value = kwargs[name]
            kwargs[name] = (
                None if value == "auto" else tuple(value) if _item_type(name)[1] else value
            )
        return RunnerConfig(**kwargs, seed=seed)
