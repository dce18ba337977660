"""What every benchmark writes with its results: the date and the software and device it ran on."""

from __future__ import annotations

import json
import platform
import time
from typing import Any

import torch


def environment() -> dict[str, Any]:
    env = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "host": platform.node(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    return env


def _json_keys(obj: Any) -> Any:
    """``obj`` with every dict key JSON can hold: a tuple key such as ``("full", 64)`` becomes
    ``"full/64"``."""
    if isinstance(obj, dict):
        return {
            ("/".join(map(str, k)) if isinstance(k, tuple) else k): _json_keys(v)
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [_json_keys(v) for v in obj]
    return obj


def write_results(path: str | None, meta: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """``{"meta": environment + meta, "results": results}`` as JSON at ``path`` (if given)."""
    if path:
        doc = {"meta": {**environment(), **meta}, "results": results}
        with open(path, "w") as f:
            json.dump(_json_keys(doc), f, indent=2)
