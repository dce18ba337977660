"""Dotted keys (``runner.async_scheduling``) through the schema: does one exist, and set one in
raw scenario data. ``--set`` overrides and matrix keys are both dotted keys."""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation holds (through unions and ``Annotated``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (Annotated, Union, types.UnionType):
        args = typing.get_args(annotation)
        args = args[:1] if origin is Annotated else args
        return [m for a in args for m in models_in(a)]
    return []


def has_key(model: type[BaseModel], dotted: str) -> bool:
    """Whether ``dotted`` names a field of ``model`` (or of a section inside it)."""
    head, _, rest = dotted.partition(".")
    info = model.model_fields.get(head)
    if info is None:
        return False
    if not rest:
        return True
    return any(has_key(m, rest) for m in models_in(info.annotation))


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """``data[a][b][c] = value`` for ``a.b.c``, making the mappings on the way."""
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value
