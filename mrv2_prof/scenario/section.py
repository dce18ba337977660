"""What every scenario section shares: frozen, unknown keys rejected, and cross-field errors
that name the sub-field at fault."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

PosInt = Annotated[int, Field(ge=1)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FieldError(ValueError):
    """Raised by cross-field checks so the error names the offending sub-field."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(problem)
