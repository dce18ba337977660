"""The start-up line: the phases from the run's facts, hand-worked, and a real run's line whose
total is the command's time before the spawn, the process's spawn-to-engine time and the
engine's start-up."""

from __future__ import annotations

import re

from test_run import QUICKSTART, cli, query

from mrv2_prof.views.startup_line import startup_line, startup_phases

FACTS = {
    "process_start_s": 2.25,
    "startup_s": 6.0,
    "weight_load_s": 1.25,
    "profile_run_s": 0.25,
    "kv_alloc_s": 0.02,  # under 0.05 s: out of the line, in the phases
    "kernel_warmup_s": 1.5,
    "capture_s": 2.0,
    "draft_capture_s": 0.0,
    "num_graphs": 86,
}


def test_phases_are_the_engines_timings_and_other_is_the_rest_of_startup():
    phases = dict(startup_phases(FACTS))
    assert "draft graphs" not in phases  # zero
    # other = 6.0 - (1.25 + 0.25 + 0.02 + 1.5 + 2.0) = 0.98
    assert abs(phases["other"] - 0.98) < 1e-9
    assert phases["process"] == 2.25 and phases["KV cache"] == 0.02
    line = startup_line(FACTS)
    assert line == (
        "start-up 8.2 s (process 2.2 s, weights 1.2 s, profile run 0.2 s, warm-up 1.5 s, "
        "graphs 2.0 s / 86 keys, other 1.0 s)"
    )


def test_the_process_is_two_phases_where_the_runners_entry_was_recorded():
    facts = {**FACTS, "process_entry_s": 0.75}  # of the 2.25 s: 1.5 s after the entry
    phases = startup_phases(facts)
    assert phases[:2] == [("interpreter", 0.75), ("imports", 1.5)]
    assert "process" not in dict(phases)
    assert startup_line(facts).startswith("start-up 8.2 s (interpreter 0.8 s, imports 1.5 s, ")


def test_torchs_own_import_is_a_phase_of_the_imports_where_it_was_recorded():
    facts = {**FACTS, "process_entry_s": 0.75, "torch_import_s": 1.0}  # of the 1.5 s after entry
    phases = startup_phases(facts)
    assert phases[:3] == [("interpreter", 0.75), ("torch", 1.0), ("imports", 0.5)]
    assert abs(sum(s for _, s in phases) - 8.25) < 1e-9  # the same total
    assert startup_line(facts).startswith(
        "start-up 8.2 s (interpreter 0.8 s, torch 1.0 s, imports 0.5 s, "
    )
    # never more than the time after the entry (clocks of two processes): imports then nil
    over = startup_phases({**facts, "torch_import_s": 9.0})
    assert over[:2] == [("interpreter", 0.75), ("torch", 1.5)] and over[2][0] == "weights"


def test_the_host_samplers_share_of_start_up_closes_the_line():
    """With the host sampler on, its time sampling start-up is said (from 0.05 s), not a phase:
    the phases still add up to the total."""
    assert startup_line({**FACTS, "startup_sampler_s": 0.26}).endswith(
        "other 1.0 s, host sampler 0.3 s of it)"
    )
    assert startup_line({**FACTS, "startup_sampler_s": 0.04}) == startup_line(FACTS)
    assert (
        abs(sum(s for _, s in startup_phases({**FACTS, "startup_sampler_s": 0.26})) - 8.25) < 1e-9
    )


def test_the_commands_own_time_before_the_spawn_opens_the_line_and_the_total():
    facts = {**FACTS, "process_entry_s": 0.75, "command_s": 0.5}
    phases = startup_phases(facts)
    assert phases[:3] == [("command", 0.5), ("interpreter", 0.75), ("imports", 1.5)]
    assert abs(sum(s for _, s in phases) - 8.75) < 1e-9  # 0.5 + 2.25 + 6.0
    assert startup_line(facts).startswith("start-up 8.8 s (command 0.5 s, interpreter 0.8 s, ")


def test_a_run_stored_before_the_process_time_was_recorded_has_no_process_phase():
    old = {k: v for k, v in FACTS.items() if k != "process_start_s"}
    assert [name for name, _ in startup_phases(old)][0] == "weights"
    assert startup_line(old).startswith("start-up 6.0 s (weights 1.2 s")


def test_a_headless_runs_line_totals_process_and_engine_startup(tmp_path):
    db = tmp_path / "runs.duckdb"
    proc = cli("run", str(QUICKSTART), "--headless", "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    text = " ".join((proc.stdout + proc.stderr).split())  # the progress console may wrap it
    got = re.search(r"start-up (\d+\.\d) s \(([^)]*)\)", text)
    assert got, text
    pairs = re.findall(r"([a-z ]+) (\d+\.\d) s", got.group(2))
    shown = {name.strip(): float(v) for name, v in pairs}
    sql = ("SELECT info->>'process_start_s', info->>'startup_s', info->>'process_entry_s', "
           "info->>'torch_import_s', info->>'command_s' FROM runs")  # fmt: skip
    (info,) = query(db, sql)
    process, startup, entry, torch_s, command = (float(v) for v in info)
    assert 0.1 < process < 60  # a fresh interpreter importing torch takes a while
    assert 0 < entry < process  # the target began before the engine's imports were done
    assert 0.1 < torch_s < process - entry  # torch's import, inside the imports
    assert 0.05 < command < 60  # the command's imports and checks, before the spawn
    assert float(got.group(1)) == round(command + process + startup, 1)
    assert shown["command"] == round(command, 1)
    assert shown["interpreter"] == round(entry, 1)
    assert shown["torch"] == round(torch_s, 1)
    assert shown.get("imports", 0.0) == round(process - entry - torch_s, 1)
