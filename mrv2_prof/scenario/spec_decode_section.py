"""The scenario's ``runner.spec_decode`` section: the drafter, k, dynamic k, the n-gram window
and the draft model; ``to_config`` is the bridge to the runner's ``SpecDecodeConfig``, whose own
rules (between fields) give the errors, each naming its field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, model_validator

from mrv2_prof.runner.config import (
    MAX_NGRAM,
    MAX_SPECULATIVE_TOKENS,
    ConfigError,
    SpecDecodeConfig,
)
from mrv2_prof.scenario.section import FieldError, PosInt, Section


class NgramSection(Section):
    min: Annotated[int, Field(ge=1, le=MAX_NGRAM)] = 2
    max: Annotated[int, Field(ge=1, le=MAX_NGRAM)] = 4


class DraftSection(Section):
    preset: Annotated[str, StringConstraints(max_length=100)] | None = None
    path: Annotated[str, StringConstraints(max_length=4096)] | None = None
    target_layers: PosInt | None = None


class SpecDecodeSection(Section):
    method: Literal["none", "ngram", "draft_model"] = "none"
    num_speculative_tokens: Annotated[int, Field(ge=1, le=MAX_SPECULATIVE_TOKENS)] = 4
    # {batch_size_upper_bound: k}; keys also as the strings a JSON round trip makes of them
    dynamic_k: (
        dict[
            Annotated[int, Field(ge=1, strict=False)],
            Annotated[int, Field(ge=0, le=MAX_SPECULATIVE_TOKENS)],
        ]
        | None
    ) = None
    # where drafts are made and kept: device (auto) or the host's token history
    draft_on: Literal["auto", "device", "host"] = "auto"
    adaptive: bool | None = None  # measured acceptance and step times may turn k to 0
    ngram: NgramSection = NgramSection()
    draft: DraftSection = DraftSection()

    @model_validator(mode="after")
    def _between_fields(self) -> SpecDecodeSection:
        try:
            self.to_config()
        except ConfigError as exc:
            name = (exc.field or "").removeprefix("spec_decode.")
            raise FieldError(name, exc.problem) from None
        return self

    def to_config(self) -> SpecDecodeConfig:
        return SpecDecodeConfig(**self.config_kwargs())

    def config_kwargs(self) -> dict[str, Any]:
        dynamic = self.dynamic_k
        return {
            "method": self.method,
            "num_speculative_tokens": self.num_speculative_tokens,
            "dynamic_k": None if dynamic is None else tuple(sorted(dynamic.items())),
            "ngram_min": self.ngram.min,
            "ngram_max": self.ngram.max,
            "draft_preset": self.draft.preset,
            "draft_path": self.draft.path,
            "draft_target_layers": self.draft.target_layers,
            "draft_on": self.draft_on,
            "adaptive": self.adaptive,
        }
