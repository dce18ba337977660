"""Dotted keys (``runner.async_scheduling``) through the schema: does one exist, and set one in
raw scenario data. ``--set`` overrides and matrix keys are both dotted keys."""

from __future__ import annotations

import difflib
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


def section_keys(model: type[BaseModel], dotted_parent: str) -> list[str]:
    """The keys a section takes: of ``model`` itself when ``dotted_parent`` is "", else of the
    section(s) ``dotted_parent`` names (every member of a union, e.g. the length dists)."""
    models = [model]
    for part in dotted_parent.split(".") if dotted_parent else ():
        infos = [m.model_fields.get(part) for m in models]
        models = [s for info in infos if info is not None for s in models_in(info.annotation)]
    return sorted({name for m in models for name in m.model_fields})


def did_you_mean(model: type[BaseModel], dotted: str) -> str:
    """`` (did you mean 'runner.max_num_seqs'?)`` for a misspelt ``dotted`` key, else "".

    The first part that is not a key is matched (``difflib.get_close_matches``) against the
    keys of its own section only; the suggestion is the whole dotted key."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        parent = ".".join(parts[:i])
        valid = section_keys(model, parent)
        if part in valid:
            continue
        close = difflib.get_close_matches(part, valid, n=1, cutoff=0.6)
        if not close:
            return ""
        fixed = ".".join([*parts[:i], close[0], *parts[i + 1 :]])
        return f" (did you mean '{fixed}'?)" if has_key(model, fixed) else ""
    return ""
