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


def write_results(path: str | None, meta: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """``{"meta": environment + meta, "results": results}`` as JSON at ``path`` (if given)."""
    if path:
        with open(path, "w") as f:
            json.dump({"meta": {**environment(), **meta}, "results": results}, f, indent=2)
