"""``mrv2-prof run`` end to end through the real entry point, checked against the store contract
(docs/architecture.md, "Store contract")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
import yaml

from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.model import PRESETS
from mrv2_prof.scenario import load_quickstart, load_scenario
from mrv2_prof.workload import build_workload

ROOT = Path(__file__).resolve().parents[1]
VOCAB = PRESETS["llama-tiny"].vocab_size
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


def cli(
    *args: str, cwd: Path | None = None, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mrv2_prof", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=None if env is None else os.environ | env,
    )


def query(db: Path, sql: str, *params) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


def check_store_contract(db: Path, run_id: str) -> None:
    """The store contract's invariants that hold for every completed run."""
    (steps, lo, hi) = query(
        db, "SELECT count(*), min(step), max(step) FROM steps WHERE run_id=?", run_id
    )[0]
    assert steps > 0 and lo == 0 and hi == steps - 1  # numbered without gaps
    assert query(db, "SELECT count(DISTINCT step) FROM steps WHERE run_id=?", run_id)[0][0] == steps
    assert query(
        db,
        "SELECT count(*) FROM steps WHERE run_id=? AND NOT (cpu_start_ns <= cpu_end_ns)",
        run_id,
    ) == [(0,)]
    (tokens,) = query(db, "SELECT count(*) FROM tokens WHERE run_id=?", run_id)[0]
    (outputs,) = query(db, "SELECT sum(output_tokens) FROM requests WHERE run_id=?", run_id)[0]
    assert tokens == outputs
    # Tokens of a request are numbered 0..n-1 and emitted in order.
    assert query(
        db,
        """SELECT count(*) FROM (
             SELECT req_id, max(idx) + 1 AS n, count(*) AS c,
                    bool_and(t_ns >= lag_t OR lag_t IS NULL) AS ordered
             FROM (SELECT *, lag(t_ns) OVER (PARTITION BY req_id ORDER BY idx) AS lag_t
                   FROM tokens WHERE run_id = ?) GROUP BY req_id)
           WHERE n != c OR NOT ordered""",
        run_id,
    ) == [(0,)]
    assert query(
        db,
        """SELECT count(*) FROM requests WHERE run_id = ? AND finish_reason != 'abort'
           AND NOT (arrival_ns <= first_token_ns AND first_token_ns <= finish_ns
                    AND first_token_ns - arrival_ns <= finish_ns - arrival_ns)""",
        run_id,
    ) == [(0,)]
    # Spans: well-formed, inside their step, named by the phase list.
    assert query(
        db,
        """SELECT count(*) FROM spans s JOIN steps t USING (run_id, step)
           WHERE run_id = ? AND s.name NOT IN ('flush')
             AND NOT (s.start_ns <= s.end_ns AND t.cpu_start_ns <= s.start_ns
                      AND s.end_ns <= t.cpu_end_ns)""",
        run_id,
    ) == [(0,)]
    names = {n for (n,) in query(db, "SELECT DISTINCT name FROM spans WHERE run_id=?", run_id)}
    assert {"step", "schedule", "execute", "prepare", "forward", "sample", "update"} <= names
    assert query(db, "SELECT count(*) FROM spans WHERE run_id=? AND track != 'cpu'", run_id) == [
        (0,)
    ]


def run_id_of(db: Path, label: str | None = None) -> str:
    sql = "SELECT run_id FROM runs" + (" WHERE label = ?" if label else "")
    rows = query(db, sql, *([label] if label else []))
    assert len(rows) == 1, rows
    return rows[0][0]


def reference_tokens(scenario, reqs) -> dict[str, list[int]]:
    """The same requests through an in-process engine (no harness, no probe)."""
    engine = Engine(scenario.runner_config(), scenario.model_spec())
    for i, w in enumerate(reqs):
        params = SamplingParams(
            temperature=w.temperature,
            max_tokens=w.max_tokens,
            seed=w.seed,
            ignore_eos=w.ignore_eos,
        )
        engine.add_request(w.req_id, list(w.prompt_token_ids), params, arrival_time=float(i))
    done = {}
    requests = dict(engine.scheduler.requests)
    while engine.has_unfinished_requests():
        engine.step()
    for rid, r in requests.items():
        done[rid] = r.output_token_ids
    return done


def test_embedded_quickstart_equals_the_shipped_file():
    shipped = load_scenario(QUICKSTART)
    assert shipped.model_dump() == load_quickstart().model_dump()


@pytest.mark.parametrize("async_scheduling", ["false", "true"])
def test_quickstart_end_to_end(tmp_path, async_scheduling):
    """The shipped quickstart (synchronous), and the same with async scheduling: the same
    contract and the same token ids as the synchronous engine on its own."""
    db = tmp_path / "runs.duckdb"
    sets = ("--set", f"runner.async_scheduling={async_scheduling}")
    proc = cli("run", str(QUICKSTART), "--db", str(db), "--headless", *sets)
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stdout and "completed" in proc.stdout
    assert "leaked" not in proc.stderr  # the runner process exits without a noisy teardown
    rid = run_id_of(db)
    (status, error, name, device) = query(
        db, "SELECT status, error, scenario_name, device FROM runs WHERE run_id=?", rid
    )[0]
    assert (status, error, name, device) == ("completed", None, "quickstart", "cpu")
    check_store_contract(db, rid)

    scenario = load_scenario(QUICKSTART)
    reqs = build_workload(
        scenario.workload, seed=scenario.seed, vocab_size=VOCAB, max_model_len=1024
    )
    rows = query(
        db,
        "SELECT req_id, prompt_tokens, output_tokens, finish_reason FROM requests WHERE run_id=?",
        rid,
    )
    assert sorted(rows) == sorted(
        (w.req_id, len(w.prompt_token_ids), w.max_tokens, "length") for w in reqs
    )
    # Every stored token id is what the runner produces for that request on its own.
    stored: dict[str, list[int]] = {}
    for req_id, token_id in query(
        db, "SELECT req_id, token_id FROM tokens WHERE run_id=? ORDER BY req_id, idx", rid
    ):
        stored.setdefault(req_id, []).append(token_id)
    assert stored == reference_tokens(scenario, reqs)
    # One staged-write record per step that wrote, never more bytes than a dense copy.
    assert query(
        db,
        "SELECT count(*) FROM staged_writes WHERE run_id=? AND staged_bytes > dense_bytes",
        rid,
    ) == [(0,)]

    # The run can be listed and summarised again.
    listing = cli("runs", "--db", str(db))
    assert listing.returncode == 0 and rid in listing.stdout and "completed" in listing.stdout
    shown = cli("show", "latest", "--db", str(db), "--json")
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert summary["run_id"] == rid and summary["num_completed"] == len(reqs)
    assert summary["output_tokens"] == sum(w.max_tokens for w in reqs)


def test_aborts_and_poisson_arrivals_as_intended(tmp_path):
    db = tmp_path / "runs.duckdb"
    sets = [
        "workload.abort_fraction=0.25",
        "workload.arrival={pattern: poisson, rate: 200}",
        "workload.shared_prefix={groups: 2, len: 32}",
        "workload.sampling={temperature: 0.7, top_p: 0.9, logprobs: 2}",
    ]
    args = [a for s in sets for a in ("--set", s)]
    proc = cli("run", str(QUICKSTART), "--db", str(db), "--headless", *args)
    assert proc.returncode == 0, proc.stderr
    rid = run_id_of(db)
    check_store_contract(db, rid)
    scenario = load_scenario(QUICKSTART, sets)
    reqs = {
        w.req_id: w
        for w in build_workload(
            scenario.workload, seed=scenario.seed, vocab_size=VOCAB, max_model_len=1024
        )
    }
    rows = query(
        db,
        "SELECT req_id, output_tokens, finish_reason, arrival_ns, cached_tokens FROM requests "
        "WHERE run_id=?",
        rid,
    )
    assert len(rows) == len(reqs) == 16
    aborted = 0
    for req_id, out, reason, _, _ in rows:
        w = reqs[req_id]
        if w.abort_after_tokens is None:
            assert (reason, out) == ("length", w.max_tokens)
        else:
            aborted += 1
            assert (reason, out) == ("abort", w.abort_after_tokens)
    assert aborted == 4
    # Arrivals keep the drawn spacing (open loop): offsets from the first arrival match.
    first = min(a for _, _, _, a, _ in rows)
    t0_s = min(w.arrival_s for w in reqs.values())
    for req_id, _, _, arrival_ns, _ in rows:
        assert (arrival_ns - first) / 1e9 == pytest.approx(reqs[req_id].arrival_s - t0_s, abs=1e-6)
    assert sum(c for *_, c in rows) > 0  # shared prefixes hit the prefix cache


def test_trace_replay_keeps_ids_and_tokens(tmp_path):
    trace = tmp_path / "traffic.jsonl"
    lines = [
        {"id": "alpha", "arrival_s": 0.0, "prompt_token_ids": [5, 6, 7, 8], "max_tokens": 5},
        {"id": 42, "arrival_s": 0.05, "prompt_len": 20, "max_tokens": 3},
        {"arrival_s": 0.01, "prompt_len": 9, "max_tokens": 4, "ignore_eos": True},
    ]
    trace.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    scen = tmp_path / "replay.yaml"
    data = yaml.safe_load(QUICKSTART.read_text())
    data["name"] = "replay"
    data["workload"] = {"trace": "traffic.jsonl"}
    data["matrix"] = {"runner.staged_writes": [True, False]}
    scen.write_text(yaml.safe_dump(data))
    db = tmp_path / "runs.duckdb"
    proc = cli("run", str(scen), "--db", str(db), "--headless")
    assert proc.returncode == 0, proc.stderr

    runs = query(db, "SELECT run_id, label, matrix_combo FROM runs ORDER BY label")
    table = proc.stdout.split("matrix", 1)[1]  # the comparison table closes the sweep
    assert "staged_writes" in table and all(rid in table for rid, _, _ in runs)
    assert [(label, json.loads(combo)) for _, label, combo in runs] == [
        ("replay[runner.staged_writes=false]", {"runner.staged_writes": False}),
        ("replay[runner.staged_writes=true]", {"runner.staged_writes": True}),
    ]
    tokens = {}
    for rid, _, _ in runs:
        check_store_contract(db, rid)
        reqs = dict(query(db, "SELECT req_id, output_tokens FROM requests WHERE run_id=?", rid))
        assert reqs == {"alpha": 5, "42": 3, "3": 4}
        tokens[rid] = query(
            db, "SELECT req_id, idx, token_id FROM tokens WHERE run_id=? ORDER BY ALL", rid
        )
    # Staged and dense writes are two ways of moving the same state: same greedy tokens.
    assert tokens[runs[0][0]] == tokens[runs[1][0]]
    # Staged writes move fewer bytes than the dense copies they replace.
    (staged_true, dense_true) = query(
        db,
        "SELECT sum(staged_bytes), sum(dense_bytes) FROM staged_writes WHERE run_id=?",
        runs[1][0],
    )[0]
    assert staged_true < dense_true


def test_sigint_to_the_process_group_keeps_the_steps(tmp_path):
    db = tmp_path / "runs.duckdb"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "mrv2_prof", "run", str(QUICKSTART), "--db", str(db),
            "--headless", "--set", "workload.num_requests=400",
            "--set", "workload.output_len={dist: fixed, value: 400}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as in a terminal
    )  # fmt: skip
    deadline = time.monotonic() + 120
    started = False
    for line in proc.stderr:  # the runner reports its run id once the model is loaded
        if "run " in line and "quickstart" in line:
            started = True
            break
        assert time.monotonic() < deadline
    assert started
    time.sleep(2.5)  # past at least one store flush
    os.killpg(proc.pid, signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, rest
    rid = run_id_of(db)
    (status, error) = query(db, "SELECT status, error FROM runs WHERE run_id=?", rid)[0]
    assert status == "aborted" and "SIGINT" in error
    (steps, hi) = query(db, "SELECT count(*), max(step) FROM steps WHERE run_id=?", rid)[0]
    assert steps > 0 and hi == steps - 1
    (unfinished,) = query(
        db, "SELECT count(*) FROM requests WHERE run_id=? AND finish_ns IS NULL", rid
    )[0]
    assert unfinished > 0  # in-flight requests are stored without a finish
    (tokens,) = query(db, "SELECT count(*) FROM tokens WHERE run_id=?", rid)[0]
    (outputs,) = query(db, "SELECT sum(output_tokens) FROM requests WHERE run_id=?", rid)[0]
    assert tokens == outputs


# ---- bad input: one line naming the field, exit 2, nothing written ----------------------------
def _scenario(tmp_path: Path, patch: dict) -> Path:
    data = yaml.safe_load(QUICKSTART.read_text())
    for dotted, value in patch.items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


BAD_SCENARIOS = [
    ({"runner.block_size": 0}, [], "runner.block_size: must be >= 1"),
    ({"runner.bogus": 1}, [], "runner.bogus: unknown key"),
    ({"runner.max_num_seqs": "many"}, [], "runner.max_num_seqs"),
    (
        {"runner.cudagraph_capture_sizes": [1, 4096]},
        [],
        "runner.cudagraph_capture_sizes: size 4096 exceeds max_num_batched_tokens 2048",
    ),
    ({"workload.trace": "missing.jsonl"}, [], "workload.trace: trace file not found"),
    ({"workload.output_len": {"dist": "zipf"}}, [], "workload.output_len: unknown dist 'zipf'"),
    ({"model.preset": "gpt-5"}, [], "model.preset: 'gpt-5' is not one of"),
    ({}, ["runner.nope=1"], "runner.nope: unknown key (from --set)"),
    ({}, ["runner.async_scheduling=maybe"], "runner.async_scheduling"),
    ({}, ["runner.num_kv_blocks=2"], "runner.num_kv_blocks: 2 blocks of 16 tokens"),
    ({"matrix": {"runner.nope": [1, 2]}}, [], "matrix.runner.nope: unknown key"),
    (
        {"probes.cuda_events": True},
        ["runner.strict=true"],
        "probes.cuda_events: the run is on the CPU; there is no GPU timeline (strict: true)",
    ),
    (
        {"runner.cudagraph_mode": "full", "runner.device": "cpu"},
        ["runner.strict=true"],
        "runner.cudagraph_mode: full: CUDA graphs need a CUDA device",
    ),
    ({"runner.uva": True}, ["runner.strict=true"], "runner.uva: needs the Triton kernels"),
]


@pytest.mark.parametrize(("patch", "sets", "expected"), BAD_SCENARIOS)
def test_bad_scenario_is_one_line_exit_2(tmp_path, patch, sets, expected):
    path = _scenario(tmp_path, patch)
    db = tmp_path / "runs.duckdb"
    args = [a for s in sets for a in ("--set", s)]
    proc = cli("run", str(path), "--db", str(db), "--headless", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert expected in lines[0]
    assert not db.exists()  # nothing written


def test_bad_trace_line_and_missing_files(tmp_path):
    trace = tmp_path / "traffic.jsonl"
    trace.write_text('{"prompt_len": 4, "max_tokens": 2}\n{"prompt_len": 4, "top_p": 2}\n')
    path = _scenario(tmp_path, {"workload": {"trace": str(trace)}})
    proc = cli("run", str(path), "--db", str(tmp_path / "x.duckdb"), "--headless")
    assert proc.returncode == 2
    assert "traffic.jsonl: line 2: top_p" in proc.stderr and len(proc.stderr.splitlines()) == 1

    proc = cli("run", str(tmp_path / "nope.yaml"), "--headless")
    assert proc.returncode == 2 and "nope.yaml" in proc.stderr

    path = _scenario(tmp_path, {"model": {"path": str(tmp_path / "ckpt")}})
    proc = cli("run", str(path), "--headless", "--db", str(tmp_path / "x.duckdb"))
    assert proc.returncode == 2 and "checkpoint directory does not exist" in proc.stderr


def test_bad_database_and_unknown_run(tmp_path):
    junk = tmp_path / "junk.duckdb"
    junk.write_text("not a database at all")
    proc = cli("run", str(QUICKSTART), "--db", str(junk), "--headless")
    assert proc.returncode == 2 and "not a DuckDB database" in proc.stderr
    assert junk.read_text() == "not a database at all"  # untouched
    proc = cli("show", "abc", "--db", str(tmp_path / "none.duckdb"))
    assert proc.returncode == 2 and "none.duckdb" in proc.stderr
    quick_db = tmp_path / "q.duckdb"  # the embedded quickstart takes --set: a bad one is refused
    proc = cli("run", "--set", "runner.max_num_seqs=0", "--db", str(quick_db), "--headless")
    assert proc.returncode == 2 and "runner.max_num_seqs" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not quick_db.exists()


def test_second_writer_gets_a_one_line_error(tmp_path):
    db = tmp_path / "runs.duckdb"
    holder = subprocess.Popen(
        [
            sys.executable, "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('held', flush=True);"
            " time.sleep(60)",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = cli("run", str(QUICKSTART), "--db", str(db), "--headless")
        assert proc.returncode == 2
        assert len(proc.stderr.splitlines()) == 1
        assert str(db) in proc.stderr and "--db" in proc.stderr and "PID" in proc.stderr
    finally:
        holder.kill()


def test_runner_config_errors_are_found_before_the_run_row(tmp_path):
    """A setting the runner used to find wrong only at start-up (here: a max_model_len beyond
    the model's positions) is refused before a run row exists: one line, exit 2, no database."""
    db = tmp_path / "runs.duckdb"
    proc = cli(
        "run", str(QUICKSTART), "--db", str(db), "--headless",
        "--set", "runner.max_model_len=8192", "--set", "runner.device=cpu",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "runner.max_model_len" in proc.stderr and "max_position_embeddings" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not db.exists()


def test_auto_kv_blocks_on_cpu_holds_every_sequence_at_full_length(tmp_path):
    """num_kv_blocks: auto on a CPU sizes the cache for max_num_seqs requests of max_model_len
    (within the 4 GiB budget), and the run completes."""
    db = tmp_path / "runs.duckdb"
    proc = cli(
        "run", str(QUICKSTART), "--db", str(db), "--headless",
        "--set", "runner.num_kv_blocks=auto", "--set", "runner.device=cpu",
        "--set", "runner.max_num_seqs=4", "--set", "runner.max_model_len=256",
        "--set", "runner.block_size=16", "--set", "workload.num_requests=4",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        status, info = con.execute("SELECT status, info FROM runs").fetchone()
    assert status == "completed"
    assert json.loads(info)["num_kv_blocks"] == 4 * 16  # 4 sequences x 256 / 16 blocks


def test_help_explains_with_examples():
    for cmd in ("run", "runs", "show"):
        proc = cli(cmd, "--help")
        assert proc.returncode == 0 and "Example" in proc.stdout, proc.stdout
    assert "--set" in cli("run", "--help").stdout
