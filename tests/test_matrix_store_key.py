"""``store.db`` (or any ``store`` key) as a matrix key: every combination would be stored in the
one run database whatever its label says, so it is refused in one line naming the key, exit 2,
before a database is made or touched."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mrv2_prof.cli import app

runner = CliRunner()
OK = (
    "name: m\nmodel: {preset: llama-tiny}\n"
    "runner: {device: cpu, kernels: torch, num_kv_blocks: 64, max_model_len: 256}\n"
    "workload: {num_requests: 1}\n"
)
CASES = {
    "files": ("matrix:\n  store.db: [a.duckdb, b.duckdb]\n", [], "matrix.store.db"),
    "a-directory": ("matrix:\n  store.db: [out]\n", [], "matrix.store.db"),
    "the-section": ("matrix:\n  store: [{db: a.duckdb}]\n", [], "matrix.store"),
    "with-another-key": (
        "matrix:\n  runner.async_scheduling: [true, false]\n  store.db: [a.duckdb]\n",
        [],
        "matrix.store.db",
    ),
    "by-set": ("", ["--set", "matrix={store.db: [a.duckdb, b.duckdb]}"], "matrix.store.db"),
}


def _digests(d: Path) -> dict[str, str]:
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(d.rglob("*"))
    }


@pytest.mark.parametrize("with_db", [False, True], ids=["default-db", "given-db"])
@pytest.mark.parametrize("name", list(CASES))
def test_store_db_is_not_a_matrix_key(
    name: str, with_db: bool, tmp_path: Path, base_db: Path, monkeypatch
) -> None:
    extra, sets, key = CASES[name]
    (tmp_path / "s.yaml").write_text(OK + extra)
    (tmp_path / "out").mkdir()
    args = ["run", str(tmp_path / "s.yaml"), "--headless", *sets]
    if with_db:
        shutil.copyfile(base_db, tmp_path / "runs.duckdb")
        args += ["--db", str(tmp_path / "runs.duckdb")]
    monkeypatch.chdir(tmp_path)  # where store.db's relative names would land
    before = _digests(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: "), lines[0]
    assert f"{key}: not a matrix key" in lines[0], lines[0]
    assert _digests(tmp_path) == before  # no database made, the given one untouched
