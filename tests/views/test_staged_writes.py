"""The staged-writes line: with staged writes off it names the tensors copied dense and those
still staged, each group with its bytes (worked out by hand below)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from mrv2_prof.cli import app
from mrv2_prof.store import Store
from mrv2_prof.views.staged_writes import staged_writes_text

KIB, MIB = 1024, 2**20
# A staged_writes=false run: block_table and num_computed_tokens copied whole (staged = dense),
# prefill_token_ids and num_prefill_tokens staged (6,348 + 320 = 6,668 B = 6.5 KiB of 4 MiB +
# 4 KiB = 4.0 MiB dense); copied dense 16 MiB + 256 KiB = 16.2 MiB.
BY_TENSOR = [
    ("block_table", 16 * MIB, 16 * MIB),
    ("num_computed_tokens", 256 * KIB, 256 * KIB),
    ("num_prefill_tokens", 320, 4 * KIB),
    ("prefill_token_ids", 6348, 4 * MIB),
]
STAGED = sum(t[1] for t in BY_TENSOR)
DENSE = sum(t[2] for t in BY_TENSOR)
OFF = (
    "16.3 MiB moved vs 20.3 MiB for dense copies; runner.staged_writes off, copied dense: "
    "block_table, num_computed_tokens (16.2 MiB); still staged: num_prefill_tokens, "
    "prefill_token_ids (6.5 KiB vs 4.0 MiB dense)"
)


def test_staged_writes_off_names_the_tensors_still_staged():
    assert staged_writes_text(STAGED, DENSE, BY_TENSOR, staged_writes=False) == OFF


def test_staged_writes_on_or_unknown_is_the_totals_only():
    totals = "16.3 MiB moved vs 20.3 MiB for dense copies"
    assert staged_writes_text(STAGED, DENSE, BY_TENSOR, staged_writes=True) == totals
    assert staged_writes_text(STAGED, DENSE, BY_TENSOR) == totals
    assert staged_writes_text(0, 0, [], staged_writes=False) == "0 B moved vs 0 B for dense copies"


def test_show_prints_the_tensors_still_staged(tmp_path: Path):
    db = tmp_path / "runs.duckdb"
    with Store.open(db) as store:
        store.begin_run(
            "5f0001", scenario_name="s", label="s", matrix_combo=None,
            scenario_yaml="name: s\nrunner: {staged_writes: false}\n", device="cpu",
            versions={}, started_ns=0,
        )  # fmt: skip
        store.append("5f0001", "staged_writes", {
            "step": [0] * 4, "tensor": [t[0] for t in BY_TENSOR], "rows": [1] * 4,
            "elements": [1] * 4, "staged_bytes": [t[1] for t in BY_TENSOR],
            "dense_bytes": [t[2] for t in BY_TENSOR],
        })  # fmt: skip
        store.finish_run("5f0001", "completed", ended_ns=1)
    result = CliRunner().invoke(app, ["show", "5f0001", "--db", str(db)])
    assert result.exit_code == 0, result.output
    words = " ".join(result.output.split())  # the row wraps at spaces on a narrow terminal
    assert f"staged writes {OFF} sync points" in words
