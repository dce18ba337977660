"""Your own checkpoint over a scenario's preset: ``model.path`` replaces the preset (a note on
the run says so), ``--set model.preset`` replaces a path the same way; ``show`` and ``runs`` name
the model (a preset's name; a checkpoint's name from its config, and its path); a misspelt key
says the valid key it is closest to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mrv2_prof.scenario import ScenarioError, expand_matrix, load_quickstart, load_scenario

REPLACED = "model.path '/models/mine' replaces the scenario's model.preset 'llama-tiny'"


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400"}  # a long path on one line
    return subprocess.run(
        [sys.executable, "-m", "mrv2_prof", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_a_path_from_set_replaces_the_scenarios_preset_with_a_note():
    s = load_quickstart(["model.path=/models/mine"])
    assert (s.model.preset, s.model.path) == (None, "/models/mine")
    assert s.notes == (REPLACED,)
    assert s.model_spec().path == "/models/mine" and s.model_spec().preset is None


def test_a_path_in_the_file_replaces_its_preset_and_a_preset_from_set_replaces_a_path(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nmodel: {preset: llama-tiny, path: /models/mine}\n")
    s = load_scenario(f)
    assert (s.model.preset, s.model.path, s.notes) == (None, "/models/mine", (REPLACED,))
    f.write_text("name: s\nmodel: {path: /models/mine}\n")
    s = load_scenario(f, ["model.preset=llama-tiny"])
    assert (s.model.preset, s.model.path) == ("llama-tiny", None)
    assert s.notes == (
        "model.preset: 'llama-tiny' (from --set) replaces the scenario's model.path '/models/mine'",
    )
    assert load_scenario(f).notes == ()  # a path alone replaces nothing


def test_a_matrix_of_paths_replaces_no_preset_the_user_did_not_write(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nmatrix: {model.path: [/a, /b]}\n")
    combos = [c for _, c in expand_matrix(load_scenario(f))]
    assert [(c.model.path, c.notes) for c in combos] == [("/a", ()), ("/b", ())]
    f.write_text("name: s\nmodel: {preset: llama-tiny}\nmatrix: {model.path: [/models/mine]}\n")
    (combo,) = [c for _, c in expand_matrix(load_scenario(f))]
    assert combo.notes == (REPLACED,)


@pytest.mark.parametrize(
    ("key", "suggestion", "in_file"),
    [
        ("runner.max_num_seq", "runner.max_num_seqs", None),
        # in a file the unknown key is the section itself: model's keys are not looked at
        ("modle.path", "model.path", ("modle", "model")),
        ("probes.nvtxx", "probes.nvtx", None),
        ("workload.arrival.rat", "workload.arrival.rate", None),
        ("runner.spec_decode.methd", "runner.spec_decode.method", None),
    ],
)
def test_a_misspelt_key_says_the_closest_valid_key(tmp_path, key, suggestion, in_file):
    with pytest.raises(ScenarioError) as from_set:
        load_quickstart([f"{key}=4"])
    assert str(from_set.value) == (
        f"<quickstart>: {key}: unknown key (from --set) (did you mean '{suggestion}'?)"
    )
    section, _, leaf = key.rpartition(".")
    nested = {}
    node = nested
    for part in section.split("."):
        node = node.setdefault(part, {})
    node[leaf] = 4
    f = tmp_path / "s.yaml"
    f.write_text(json.dumps({"name": "s", **nested}))  # JSON is YAML
    with pytest.raises(ScenarioError) as from_file:
        load_scenario(f)
    key, suggestion = in_file or (key, suggestion)
    assert str(from_file.value) == f"{f}: {key}: unknown key (did you mean '{suggestion}'?)"


def test_a_key_close_to_nothing_gets_no_guess():
    with pytest.raises(ScenarioError) as err:
        load_quickstart(["runner.zzzzzz=1"])
    assert str(err.value) == "<quickstart>: runner.zzzzzz: unknown key (from --set)"


def test_a_misspelt_set_is_one_line_exit_2(tmp_path):
    db = tmp_path / "runs.duckdb"
    proc = cli("run", "--headless", "--db", str(db), "--set", "runner.max_num_seq=4")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: <quickstart>: runner.max_num_seq: unknown key (from --set) "
        "(did you mean 'runner.max_num_seqs'?)"
    )
    assert not db.exists()


def test_show_and_runs_name_the_preset_and_the_checkpoint(tmp_path, make_hf_checkpoint):
    ckpt = make_hf_checkpoint(tmp_path, max_position_embeddings=2048, name="ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    config["_name_or_path"] = "my-org/tiny-llama"  # the name a hub checkpoint carries
    (ckpt / "config.json").write_text(json.dumps(config))
    db = tmp_path / "runs.duckdb"
    small = ["--set", "workload.num_requests=2", "--set", "workload.output_len.value=4"]
    preset = cli("run", "--headless", "--db", str(db), *small)
    assert preset.returncode == 0, preset.stderr[-2000:]
    own = cli("run", "--headless", "--db", str(db), *small, "--set", f"model.path={ckpt}")
    assert own.returncode == 0, own.stderr[-2000:]
    # the run says its path replaced the quickstart's preset, at start and in show
    note = f"model.path '{ckpt}' replaces the scenario's model.preset 'llama-tiny'"
    assert f"note {note}" in " ".join(own.stderr.split())  # the start line's notes
    runs = cli("runs", "--db", str(db))
    assert runs.returncode == 0, runs.stderr
    assert "preset llama-tiny" in runs.stdout and "my-org/tiny-llama" in runs.stdout
    latest = cli("show", "latest", "--db", str(db))
    assert latest.returncode == 0, latest.stderr
    text = " ".join(latest.stdout.split())  # rich wraps the long line
    assert f"model my-org/tiny-llama (_name_or_path, LlamaForCausalLM) at {ckpt.resolve()}" in (
        text
    )
    assert note in text
    first = cli("runs", "--db", str(db)).stdout.split("\n")
    preset_id = next(line.split()[1] for line in first if "preset llama-tiny" in line)
    shown = " ".join(cli("show", preset_id, "--db", str(db)).stdout.split())
    assert "model preset llama-tiny; " in shown


def test_a_checkpoint_without_a_name_is_named_by_its_directory(tmp_path, make_hf_checkpoint):
    from mrv2_prof.runner.config import ModelSpec
    from mrv2_prof.runner.model.model_name import model_identity

    ckpt = make_hf_checkpoint(tmp_path, name="tiny-dir")
    config = json.loads((ckpt / "config.json").read_text())
    config.pop("_name_or_path", None)
    (ckpt / "config.json").write_text(json.dumps(config))
    assert model_identity(ModelSpec(preset=None, path=str(ckpt))) == {
        "name": Path(ckpt).resolve().name, "source": "directory name",
        "path": str(Path(ckpt).resolve()), "architecture": "LlamaForCausalLM",
    }  # fmt: skip
