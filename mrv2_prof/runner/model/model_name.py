"""The name of the model a run loads, for the summary and the run list: a preset's name; a GGUF
file's ``general.name``; a Hugging Face directory's ``config.json`` ``_name_or_path``, else its
directory's name (with the architecture its ``architectures`` names). Read once at start-up
from the files the loader has just checked; what cannot be read is said, not guessed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.runner.model.args import CheckpointError
from mrv2_prof.runner.model.checkpoint_args import is_gguf, read_json
from mrv2_prof.runner.model.shipped import SHIPPED, require_shipped

MAX_NAME_CHARS = 200


def _text(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    return " ".join(value.split())[:MAX_NAME_CHARS]


def model_identity(spec: ModelSpec) -> dict[str, str]:
    """``{"name", "source", "path"?, "architecture"?}``: ``source`` says where the name was
    read (``preset``, ``general.name``, ``_name_or_path``, ``directory name``, ``file name``)."""
    if spec.preset is not None:
        out = {"name": spec.preset, "source": "preset"}
        if spec.preset in SHIPPED:
            out["path"] = str(require_shipped(spec.preset))
        return out
    path = Path(str(spec.path)).expanduser()
    out = {"path": str(path.resolve())}
    try:
        if is_gguf(path):
            from mrv2_prof.runner.model.gguf_file import read_header

            meta = read_header(path).metadata
            name, arch = _text(meta.get("general.name")), _text(meta.get("general.architecture"))
            source = "general.name"
            fallback = (path.stem, "file name")
        else:
            cfg = read_json(path / "config.json", "config")
            name, source = _text(cfg.get("_name_or_path")), "_name_or_path"
            archs = cfg.get("architectures")
            arch = _text(archs[0]) if isinstance(archs, list) and archs else None
            fallback = (path.resolve().name, "directory name")
    except CheckpointError:  # the loader has read these files; said, should it fail now
        name, arch, source, fallback = None, None, "", (path.name, "file name (unreadable)")
    if name is None:
        name, source = fallback
    out.update(name=name, source=source)
    if arch is not None:
        out["architecture"] = arch
    return out
