"""What every scenario section shares: frozen, unknown keys rejected, strict types (``true`` or
``'8'`` is not a number, a number is not a string), finite numbers only, and cross-field errors
that name the sub-field at fault."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from mrv2_prof.inputs.finite_numbers import NUMBER_RULE

PosInt = Annotated[int, Field(ge=1)]
# Seeds: a sampling seed is an int64 slot on the device and a model seed a torch generator's
# seed; the run seed is shifted left by 32 bits to derive the per-request seeds, which must
# stay int64 too, so it is smaller.
SEED_LIMIT = 2**63
RUN_SEED_LIMIT = 2**31
Seed = Annotated[int, Field(ge=0, lt=SEED_LIMIT)]
RunSeed = Annotated[int, Field(ge=0, lt=RUN_SEED_LIMIT)]
# A YAML list where the model holds a tuple, a string where it holds a path: converted, the
# items still strict (strict validation would take only a tuple or a Path object).
FROM_YAML = Field(strict=False)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, **NUMBER_RULE)


class FieldError(ValueError):
    """Raised by cross-field checks so the error names the offending sub-field."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(problem)
