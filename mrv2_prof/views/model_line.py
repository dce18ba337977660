"""The model of a stored run in one line, for ``show`` and ``runs``: its name and where the name
was read (a preset, a GGUF ``general.name``, a config's ``_name_or_path``, a directory's name),
its path, from the run's start-up facts (``runs.info.model``)."""

from __future__ import annotations

from typing import Any


def model_name(info: dict[str, Any] | None) -> str:
    """The model's name (``preset llama-tiny``, ``SmolLM2 135M``), or "" when the run did not
    record it (a run stored before the name was recorded, or one that failed at start-up)."""
    model = (info or {}).get("model")
    if not isinstance(model, dict) or not model.get("name"):
        return ""
    if model.get("source") == "preset":
        return f"preset {model['name']}"
    return str(model["name"])


def model_line(info: dict[str, Any] | None) -> str:
    """``SmolLM2 (general.name, LlamaForCausalLM) at /models/x.gguf``; "" when not recorded."""
    name = model_name(info)
    if not name:
        return ""
    model = info["model"]
    how = [model.get("source", "")] if model.get("source") != "preset" else []
    how += [model["architecture"]] if model.get("architecture") else []
    line = name + (f" ({', '.join(how)})" if how else "")
    return line + (f" at {model['path']}" if model.get("path") else "")
