"""Start-up to the first step, per phase, and the compiles after warm-up, of real runs.

Each ``--presets`` model runs ``scenarios/decode_heavy.yaml`` (default settings: its runner
section as shipped; ``--set`` adds overrides) through the CLI, ``--repeats`` times, each in a
fresh runner process as a user's run is. From each run's stored start-up facts (``runs.info``,
``views/startup_line.py``): the seconds from the spawn of the runner process to the first step
(``process_start_s + startup_s``), the command line's own time before that spawn
(``command_s``: its imports and the scenario's checks) and the phases (process, weights, profile
run, KV cache, warm-up, graph capture with its keys, other), and the Triton compiles recorded (the
``compiles`` table): those of start-up (the warm-up's and the captures': their count and ms, a
load from triton's disk cache included) and those after warm-up (the target: none). The first
repeat of a preset may pay Triton's first compiles into its disk cache; later repeats read them
from it, as a user's second run does: both are printed.

With ``--collector off on``, each repeat runs once per side, alternating (the order flips each
repeat), after one untimed run that fills Triton's disk cache and the page cache so that
neither side pays them: ``off`` as shipped (no garbage collection over torch's and the
runner's imports, their objects frozen: ``pipeline/collector.py``), ``on`` the collector left
on through them (``MRV2_PROF_START_UP_COLLECTOR=on``); the medians per side close the output.

With ``--bytecode source cached host`` the sides are Python's bytecode cache instead (the
collector as shipped): ``source`` compiles every module from source in every process, as on a
host that ships no ``.pyc`` and sets ``PYTHONDONTWRITEBYTECODE`` (``PYTHONPYCACHEPREFIX`` at an
empty directory, writing off, and the runner's own cache off: ``MRV2_PROF_BYTECODE_CACHE=off``),
``cached`` reads them from a cache the untimed first run wrote (``PYTHONPYCACHEPREFIX`` at its
own directory, writing on), ``host`` is that host as it is, ``PYTHONDONTWRITEBYTECODE`` set and
no prefix: the runner turns the cache on under ``~/.cache/mrv2-prof/bytecode``
(``$MRV2_PROF_CACHE``), which the untimed first run fills. Each run prints how many modules its
runner compiled (the run's ``bytecode`` fact, ``pipeline/bytecode_cache.py``).

With ``--standby on off`` the sides are the standby runner (``pipeline/standby.py``,
``MRV2_PROF_STANDBY``): ``on`` starts the runner's process before the command's imports and hands
it the job, ``off`` spawns it once the job exists. The spawn moves, so compare the medians from
the command (``command_s`` + the rest), not those from the spawn.

    python benchmarks/startup.py --presets llama-1b llama-3-8b --repeats 2 --out startup.json
    python benchmarks/startup.py --presets llama-1b --repeats 3 --collector off on
    python benchmarks/startup.py --presets llama-1b --repeats 3 --bytecode source cached
    python benchmarks/startup.py --presets llama-1b --repeats 3 --standby on off
    python benchmarks/startup.py --presets llama-tiny --set runner.device=cpu  # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb
from bench_io import write_results

from mrv2_prof.pipeline.bytecode_cache import CACHE_SWITCH_ENV
from mrv2_prof.pipeline.collector import ENV as COLLECTOR_ENV
from mrv2_prof.pipeline.standby import SWITCH_ENV as STANDBY_ENV
from mrv2_prof.views.startup_line import startup_phases

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "decode_heavy.yaml"


def side_env(axis: str, side: str, tmp: Path) -> dict[str, str]:
    """The environment of a run of ``side`` (``--collector`` or ``--bytecode``)."""
    env = dict(os.environ)
    if axis == "collector":
        env[COLLECTOR_ENV] = side
    elif axis == "standby":
        env[STANDBY_ENV] = side
    elif side == "source":  # nothing cached is read, nothing is written
        env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(tmp / "empty-pycache"))
        env[CACHE_SWITCH_ENV] = "off"
    elif side == "host":  # writing off, as the host sets it: the runner's own cache
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
        env.pop(CACHE_SWITCH_ENV, None)
    else:  # "cached": the untimed first run writes the cache the timed runs read
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    return env


def one_run(
    preset: str, db: Path, sets: list[str], requests: int, env: dict[str, str] | None = None
) -> dict:
    args = [sys.executable, "-m", "mrv2_prof", "run", str(SCENARIO), "--headless", "--db", str(db)]
    for s in [f"model.preset={preset}", f"workload.num_requests={requests}",
              "workload.output_len.value=16", *sets]:  # fmt: skip
        args += ["--set", s]
    done = subprocess.run(args, capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{preset}: exit {done.returncode}\n{done.stderr[-3000:]}")
    con = duckdb.connect(str(db), read_only=True)
    run_id, info = con.execute("SELECT run_id, info FROM runs ORDER BY started_ns DESC").fetchone()
    info = json.loads(info) if isinstance(info, str) else info
    late, early = (
        con.execute(
            "SELECT count(*), coalesce(sum(compile_ms), 0) FROM compiles "
            f"WHERE run_id = ? AND {'' if after else 'NOT '}after_warmup",
            [run_id],
        ).fetchone()
        for after in (True, False)
    )
    con.close()
    total = float(info.get("process_start_s") or 0) + float(info["startup_s"])
    command = float(info.get("command_s") or 0)  # the command line before the spawn
    return {
        "preset": preset,
        "bytecode": info.get("bytecode"),  # the modules the runner compiled from source
        "to_first_step_s": total,
        "command_s": command,
        "from_command_s": command + total,
        "phases": dict(startup_phases(info)),
        "num_graphs": info.get("num_graphs"),
        "gc_frozen_objects": info.get("gc_frozen_objects"),
        "triton_key_s": info.get("triton_key_s"),  # hashed on a thread (None: no thread)
        "triton_key_wait_s": info.get("triton_key_wait_s"),
        "compiles_after_warmup": int(late[0]),
        "compile_ms_after_warmup": float(late[1]),
        "startup_compiles": int(early[0]),  # warm-up and capture: their share of start-up
        "startup_compile_ms": float(early[1]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["llama-1b", "llama-3-8b"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="an override")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--collector",
        nargs="+",
        choices=["off", "on"],
        default=["off"],
        help="the garbage collector through the runner's imports: off (as shipped) and/or on "
        "(as before); several: each repeat runs each, alternating",
    )
    ap.add_argument(
        "--bytecode",
        nargs="+",
        choices=["source", "cached", "host"],
        default=None,
        help="Python's bytecode cache: source (every module compiled in every process), "
        "cached (read from a cache the untimed first run writes) and/or host (writing off, the "
        "runner's own cache on); instead of --collector",
    )
    ap.add_argument(
        "--standby",
        nargs="+",
        choices=["on", "off"],
        default=None,
        help="the standby runner (pipeline/standby.py): on (started before the command's "
        "imports, handed the job) and/or off (spawned once the job exists); instead of "
        "--collector. Compare the medians from the command: the spawn moves",
    )
    args = ap.parse_args()
    axis, sides = ("collector", args.collector)
    if args.bytecode:
        axis, sides = "bytecode", args.bytecode
    elif args.standby:
        axis, sides = "standby", args.standby
    rows = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for preset in args.presets:
            if len(sides) > 1:  # untimed: Triton's disk cache, the page cache (and pycache) filled
                one_run(preset, tmp / "first.duckdb", args.sets, args.requests,
                        side_env(axis, sides[-1], tmp))  # fmt: skip
            for repeat in range(args.repeats):
                for side in sides if repeat % 2 == 0 else sides[::-1]:
                    db = tmp / f"{preset}-{side}.duckdb"
                    env = side_env(axis, side, tmp)
                    row = one_run(preset, db, args.sets, args.requests, env)
                    row.update(repeat=repeat, side=side)
                    rows.append(row)
                    print(f"{preset} #{repeat} {axis} {side}: {describe(row)}", flush=True)
    if len(sides) > 1:
        for preset in args.presets:
            for side in sides:
                mine = [r for r in rows if r["preset"] == preset and r["side"] == side]
                med = statistics.median(r["to_first_step_s"] for r in mine)
                imports = statistics.median(r["phases"].get("imports", 0.0) for r in mine)
                torch_s = statistics.median(r["phases"].get("torch", 0.0) for r in mine)
                command = statistics.median(r["command_s"] for r in mine)
                whole = statistics.median(r["from_command_s"] for r in mine)
                print(
                    f"{preset} {axis} {side}: median {med:.2f} s to the first step, "
                    f"torch {torch_s:.2f} s, imports {imports:.2f} s; the command line "
                    f"{command:.2f} s before the spawn; {whole:.2f} s from the command "
                    f"({len(mine)} runs)"
                )
    write_results(args.out, {"scenario": str(SCENARIO.name), "sets": args.sets, axis: sides}, rows)


def describe(row: dict) -> str:
    """One run's line: to the first step, its phases, the compiles in and after start-up."""
    phases = ", ".join(f"{k} {v:.2f}" for k, v in row["phases"].items() if k != "command")
    key = row.get("triton_key_s")
    if key is not None:  # triton's cache key, hashed beside start-up, and the wait for it
        phases += (
            f"; triton's cache key {key:.2f} s on a thread, {row['triton_key_wait_s']:.2f} waited"
        )
    b = row.get("bytecode")
    if isinstance(b, dict):  # the modules this run's runner compiled from source
        phases += (
            f"; {b['compiled']} of {b['modules']} modules compiled ({b['torch_compiled']} torch)"
        )
    return (
        f"{row['to_first_step_s']:.2f} s to the first step from the spawn, "
        f"{row['from_command_s']:.2f} s from the command ({phases}; {row['num_graphs']} graph "
        f"keys); {row['startup_compiles']} compiles in start-up ({row['startup_compile_ms']:.0f} "
        f"ms), {row['compiles_after_warmup']} after warm-up "
        f"({row['compile_ms_after_warmup']:.0f} ms)"
    )


if __name__ == "__main__":
    main()
