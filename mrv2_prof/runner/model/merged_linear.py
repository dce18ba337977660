"""Merged projections: several linear maps of one input stacked along the output features, so that
q/k/v (and gate/up) are one GEMM each, while state dicts keep the checkpoint's names.

``MergedLinear`` is an ``nn.Linear`` whose output rows are its ``parts`` in order (``q_proj``,
``k_proj``, ``v_proj``). ``name_parts_in_state_dict`` makes the owning module's state dicts speak
in those part names: ``state_dict()`` gives each part as a view of the stacked weight (and bias),
and ``load_state_dict`` concatenates the parts into it once, at load. A Hugging Face checkpoint
therefore loads by name as before, and the loader's shape checks see the checkpoint's shapes.
"""

from __future__ import annotations

import torch
from torch import nn


class MergedLinear(nn.Linear):
    """One ``nn.Linear`` for ``parts`` (name -> output features), stacked in order."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool) -> None:
        super().__init__(in_features, sum(parts.values()), bias=bias)
        self.parts = dict(parts)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The parts of an output ``y`` [..., sum] as views, in order."""
        return y.split(list(self.parts.values()), dim=-1)


def name_parts_in_state_dict(module: nn.Module, name: str) -> None:
    """``module``'s state dicts name the parts of its ``MergedLinear`` child ``name``."""

    def parts() -> dict[str, int]:
        return getattr(module, name).parts

    def save(mod: nn.Module, state: dict, prefix: str, _meta) -> None:
        for kind in ("weight", "bias"):
            stacked = state.pop(f"{prefix}{name}.{kind}", None)
            if stacked is None:
                continue
            for part, rows in zip(parts(), stacked.split(list(parts().values())), strict=True):
                state[f"{prefix}{part}.{kind}"] = rows

    def load(mod: nn.Module, state: dict, prefix: str, *_) -> None:
        for kind in ("weight", "bias"):
            keys = [f"{prefix}{part}.{kind}" for part in parts()]
            if all(key in state for key in keys):
                state[f"{prefix}{name}.{kind}"] = torch.cat([state.pop(key) for key in keys])

    module.register_state_dict_post_hook(save)
    module.register_load_state_dict_pre_hook(load)
