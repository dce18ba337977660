"""Which modules the runner compiled from source: the stock taken of ``sys.modules`` against
hand-made modules and their caches, a real interpreter with bytecode writing off, and a run
through the CLI whose start-up line and findings say that torch was compiled from source; and
the runner's own cache where the host leaves Python's off (``cache_bytecode``): in a real
interpreter, and through the CLI, where the first run compiles torch and the second reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from importlib.machinery import ModuleSpec
from pathlib import Path

from test_run import QUICKSTART, cli, query

from mrv2_prof.analysis.findings import Finding, uncached_bytecode
from mrv2_prof.pipeline.bytecode_cache import CACHE_SWITCH_ENV, bytecode_facts
from mrv2_prof.views.startup_line import startup_line


def _module(name: str, src: Path, cached: Path | None) -> types.ModuleType:
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("")
    module = types.ModuleType(name)
    spec = ModuleSpec(name, None, origin=str(src))
    spec.cached = str(cached) if cached is not None else str(src) + "c"
    spec.has_location = True
    module.__spec__ = spec
    return module


def _pyc(path: Path, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    os.utime(path, (mtime, mtime))
    return path


def test_modules_are_read_from_a_cache_older_than_the_spawn_else_compiled(tmp_path, monkeypatch):
    since = time.time()
    old, new = since - 100, since + 1
    modules = {
        "torch": _module("torch", tmp_path / "torch/__init__.py", _pyc(tmp_path / "c/t0", old)),
        "torch.nn": _module("torch.nn", tmp_path / "torch/nn.py", _pyc(tmp_path / "c/t1", new)),
        "torch.fx": _module("torch.fx", tmp_path / "torch/fx.py", tmp_path / "c/none"),
        "numpy": _module("numpy", tmp_path / "numpy.py", _pyc(tmp_path / "c/np", old)),
        "torchvision": _module("torchvision", tmp_path / "tv.py", tmp_path / "c/none2"),
        "builtin": types.ModuleType("builtin"),  # no spec: not a source module
        "ext": _module("ext", tmp_path / "ext.so", tmp_path / "c/x"),  # not a .py source
    }
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    facts = bytecode_facts(since, modules)
    # source modules: torch, torch.nn, torch.fx, numpy, torchvision; compiled here: torch.nn
    # (its cache written after the spawn), torch.fx and torchvision (no cache at all)
    assert facts == {
        "modules": 5,
        "compiled": 3,
        "uncached": 2,  # torch.fx, torchvision
        "torch_modules": 3,  # "torchvision" is not torch's
        "torch_compiled": 2,
        "torch_uncached": 1,
        "why": "writing_off",
    }
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert bytecode_facts(since, modules)["why"] == "unknown"  # writable, writing on: not said
    (tmp_path / "torch").chmod(0o555)
    try:
        if not os.access(tmp_path / "torch", os.W_OK):  # (root writes anywhere)
            assert bytecode_facts(since, modules)["why"] == "read_only"
    finally:
        (tmp_path / "torch").chmod(0o755)
    cached = {k: v for k, v in modules.items() if k in ("torch", "numpy")}
    assert bytecode_facts(since, cached) == {
        "modules": 2, "compiled": 0, "uncached": 0, "torch_modules": 1, "torch_compiled": 0,
        "torch_uncached": 0, "why": None,
    }  # fmt: skip


def test_a_fresh_interpreter_with_writing_off_compiles_a_package_every_time(tmp_path):
    """A real import: with PYTHONDONTWRITEBYTECODE and an empty cache prefix nothing is read or
    written, so the package's modules count as compiled and uncached; with writing on they are
    compiled once, cached, and read by the next interpreter."""
    pkg = tmp_path / "torch_like"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a, b\n")
    (pkg / "a.py").write_text("X = 1\n")
    (pkg / "b.py").write_text("Y = 2\n")
    code = (
        "import json, sys, time; t = time.time() - 1; import torch_like; "
        "from mrv2_prof.pipeline.bytecode_cache import CACHE_SWITCH_ENV, bytecode_facts; "
        "m = {k: v for k, v in sys.modules.items() if k.startswith('torch_like')}; "
        "print(json.dumps(bytecode_facts(t, m)))"
    )

    def facts(**env: str) -> dict:
        base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        path = os.pathsep.join([str(tmp_path), *sys.path])
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=base | {"PYTHONPATH": path} | env, check=True)  # fmt: skip
        return json.loads(done.stdout)

    off = facts(PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(tmp_path / "empty"))
    assert (off["modules"], off["compiled"], off["uncached"], off["why"]) == (
        3,
        3,
        3,
        "writing_off",
    )
    prefix = str(tmp_path / "pycache")
    first = facts(PYTHONPYCACHEPREFIX=prefix)
    assert (first["compiled"], first["uncached"], first["why"]) == (3, 0, None)  # now cached
    time.sleep(1.1)  # the next interpreter's spawn after the caches were written
    second = facts(PYTHONPYCACHEPREFIX=prefix)
    assert (second["modules"], second["compiled"], second["uncached"]) == (3, 0, 0)


def test_the_line_says_torch_was_compiled_from_source_where_most_of_it_was():
    facts = {"process_start_s": 4.0, "process_entry_s": 0.5, "torch_import_s": 3.0,
             "startup_s": 1.0}  # fmt: skip
    source = {"modules": 2500, "compiled": 2500, "torch_modules": 2000, "torch_compiled": 1001}
    assert "torch 3.0 s from source," in startup_line({**facts, "bytecode": source})
    cached = {**source, "torch_compiled": 1000}  # half: not "most"
    assert "torch 3.0 s, " in startup_line({**facts, "bytecode": cached})
    assert "torch 3.0 s, " in startup_line(facts)  # a run stored before the fact


def test_the_finding_names_the_uncached_modules_the_cause_and_the_fix():
    class S:
        info = {
            "torch_import_s": 3.04,
            "bytecode": {"modules": 2500, "compiled": 2400, "uncached": 2000,
                         "torch_modules": 2100, "torch_compiled": 2100, "torch_uncached": 1900,
                         "why": "writing_off"},
        }  # fmt: skip

    found = uncached_bytecode(S, None)
    assert isinstance(found, Finding) and found.severity == 1
    assert found.weight == 2000 / 2500
    assert found.text == (
        "2,000 of 2,500 Python modules compiled from source, none cached (torch's 1,900: its "
        "import took 3.0 s): Python's bytecode writing is off (PYTHONDONTWRITEBYTECODE or -B), "
        "so every run compiles them again"
    )
    assert "unset PYTHONDONTWRITEBYTECODE" in found.where
    S.info = {"bytecode": {**S.info["bytecode"], "why": "read_only", "torch_uncached": 0}}
    found = uncached_bytecode(S, None)
    assert "their directories are read-only" in found.text and "torch's" not in found.text
    assert "PYTHONPYCACHEPREFIX" in found.where
    cache = {"prefix": "/c/bytecode", "was": "writing_off", "module": "torch"}
    S.info = {"bytecode": {**S.info["bytecode"], "torch_uncached": 0, "cache": cache}}
    assert uncached_bytecode(S, None) is None  # the few imported before the runner's cache
    S.info["bytecode"]["torch_uncached"] = 5  # the runner's cache did not take: said
    assert uncached_bytecode(S, None) is not None
    few = {"modules": 2500, "compiled": 249, "uncached": 249, "torch_uncached": 0}
    S.info = {"bytecode": few}  # torch cached, under a tenth not: not worth a finding
    assert uncached_bytecode(S, None) is None
    S.info = {"bytecode": {**few, "uncached": 250}}
    assert uncached_bytecode(S, None) is not None
    S.info = {"bytecode": {**S.info["bytecode"], "uncached": 0}}  # compiled once, now cached
    assert uncached_bytecode(S, None) is None
    S.info = {}  # a run stored before the fact
    assert uncached_bytecode(S, None) is None


def test_a_run_with_bytecode_writing_off_says_so_in_its_line_and_findings(tmp_path):
    """Through the CLI, as a container that sets PYTHONDONTWRITEBYTECODE and ships no bytecode
    would run it (an empty cache prefix: nothing read)."""
    db = tmp_path / "runs.duckdb"
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(tmp_path / "empty"),
           CACHE_SWITCH_ENV: "off"}  # fmt: skip
    proc = cli("run", str(QUICKSTART), "--headless", "--db", str(db), env=env)
    assert proc.returncode == 0, proc.stderr
    ((raw,),) = query(db, "SELECT info->'bytecode' FROM runs")
    b = json.loads(raw)
    assert b["why"] == "writing_off" and b["torch_uncached"] == b["torch_modules"] > 500
    assert b["uncached"] == b["compiled"] == b["modules"]
    assert "from source" in proc.stdout
    shown = cli("show", "latest", "--db", str(db))
    assert f"{b['uncached']:,} of {b['modules']:,} Python modules compiled from source" in (
        shown.stdout
    )


def test_the_start_up_benchmark_compiles_every_module_on_one_side_and_none_on_the_other(tmp_path):
    """``benchmarks/startup.py --bytecode source cached`` on the CPU: the source side's runner
    compiled every module it loaded, the cached side's none (the untimed first run wrote the
    cache it read), and the medians name both sides."""
    from tests.benchmark_runs import run_benchmark

    run = run_benchmark(
        "startup.py", tmp_path / "s.json", "--presets", "llama-tiny", "--set",
        "runner.device=cpu", "--repeats", "1", "--requests", "2", "--bytecode", "source",
        "cached", timeout=300,
    )  # fmt: skip
    source, cached = run.results
    assert (source["side"], cached["side"]) == ("source", "cached")
    s, c = source["bytecode"], cached["bytecode"]
    assert s["compiled"] == s["uncached"] == s["modules"] > 500 and s["why"] == "writing_off"
    assert c["compiled"] == c["uncached"] == 0 and c["modules"] > 500
    assert "llama-tiny bytecode cached: median" in run.stdout


PROBE_CODE = (
    "import json, os, sys, time; t = time.time() - 1; "
    "from mrv2_prof.pipeline.bytecode_cache import bytecode_facts, cache_bytecode; "
    "c = cache_bytecode(('probe_pkg',), export=True); import probe_pkg; "
    "m = {k: v for k, v in sys.modules.items() if k.startswith('probe_pkg')}; "
    "print(json.dumps([c, bytecode_facts(t, m), sys.dont_write_bytecode, "
    "os.environ.get('PYTHONPYCACHEPREFIX')]))"
)


def _probe_run(tmp_path: Path, **env: str) -> list:
    """A fresh interpreter that turns the cache on for ``probe_pkg`` (a package with no
    bytecode) and imports it: [what ``cache_bytecode`` did, the package's stock, writing off,
    the PYTHONPYCACHEPREFIX it leaves for the processes it starts]."""
    pkg = tmp_path / "src" / "probe_pkg"
    if not pkg.exists():
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("from . import a\n")
        (pkg / "a.py").write_text("X = 1\n")
    unset = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", CACHE_SWITCH_ENV)
    base = {k: v for k, v in os.environ.items() if k not in unset}
    path = os.pathsep.join([str(tmp_path / "src"), *sys.path])
    env = base | {"PYTHONPATH": path, "MRV2_PROF_CACHE": str(tmp_path / "cache")} | env
    done = subprocess.run([sys.executable, "-c", PROBE_CODE], capture_output=True, text=True,
                          env=env, check=True)  # fmt: skip
    return json.loads(done.stdout)


def test_the_runner_caches_bytecode_where_writing_is_off_and_reads_it_next_time(tmp_path):
    """PYTHONDONTWRITEBYTECODE and no bytecode for the probe: the cache goes on under
    ``$MRV2_PROF_CACHE/bytecode``, the package is compiled and written there (nothing beside its
    sources), and the next interpreter reads it."""
    prefix = tmp_path / "cache" / "bytecode"
    cache, first, writing_off, exported = _probe_run(tmp_path, PYTHONDONTWRITEBYTECODE="1")
    assert cache == {"prefix": str(prefix), "was": "writing_off", "module": "probe_pkg"}
    assert writing_off is False and exported == str(prefix)  # for the processes it starts
    assert (first["modules"], first["compiled"], first["uncached"]) == (2, 2, 0)
    written = sorted(p.name for p in prefix.rglob("*.pyc"))
    assert [n.split(".")[0] for n in written] == ["__init__", "a"]
    assert not list((tmp_path / "src").rglob("*.pyc"))
    time.sleep(1.1)  # the next interpreter starts after the caches were written
    cache, second, _, _ = _probe_run(tmp_path, PYTHONDONTWRITEBYTECODE="1")
    assert cache == {"prefix": str(prefix), "was": "writing_off", "module": "probe_pkg"}
    assert (second["modules"], second["compiled"], second["uncached"]) == (2, 0, 0)


def test_the_cache_is_left_alone_when_switched_off_or_when_python_caches_it_itself(tmp_path):
    off = _probe_run(tmp_path, PYTHONDONTWRITEBYTECODE="1", **{CACHE_SWITCH_ENV: "off"})
    assert off[0] is None and off[2] is True and off[1]["uncached"] == 2 and off[3] is None
    assert not (tmp_path / "cache").exists()
    on = _probe_run(tmp_path)  # writing on, a writable __pycache__: Python's own cache
    assert on[0] is None and on[1]["uncached"] == 0
    assert list((tmp_path / "src").rglob("*.pyc")) and not (tmp_path / "cache").exists()
    again = _probe_run(tmp_path, PYTHONDONTWRITEBYTECODE="1")  # a cache there now: read
    assert again[0] is None and again[1]["uncached"] == 0
    prefix = tmp_path / "own"  # the environment's own prefix, writing off: written there
    own = _probe_run(tmp_path, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(prefix))
    assert own[0] == {"prefix": str(prefix), "was": "writing_off", "module": "probe_pkg"}
    assert len(list(prefix.rglob("*.pyc"))) == 2


def test_a_host_with_writing_off_compiles_torch_once_and_reads_it_in_later_runs(tmp_path):
    """Through the CLI, as a container that sets PYTHONDONTWRITEBYTECODE (an empty prefix of
    its own: nothing cached to read): the first run compiles torch, caches it and says so in a
    note; the second reads it, and neither has the uncached-bytecode finding."""
    db = tmp_path / "runs.duckdb"
    prefix = tmp_path / "pyc"
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(prefix),
           CACHE_SWITCH_ENV: "on"}  # fmt: skip
    first = cli("run", str(QUICKSTART), "--headless", "--db", str(db), env=env)
    assert first.returncode == 0, first.stderr
    time.sleep(1.1)
    second = cli("run", str(QUICKSTART), "--headless", "--db", str(db), env=env)
    assert second.returncode == 0, second.stderr
    (a,), (b,) = query(db, "SELECT info->'bytecode' FROM runs ORDER BY started_ns")
    a, b = json.loads(a), json.loads(b)
    assert a["cache"] == {"prefix": str(prefix), "was": "writing_off", "module": "torch"}
    assert b["cache"] is None  # its own prefix holds the cache now: nothing to change
    assert a["torch_compiled"] == a["torch_modules"] > 500 and a["torch_uncached"] == 0
    assert b["torch_compiled"] == 0  # the rest: those imported before the runner's switch
    assert b["compiled"] == b["uncached"] < b["modules"] / 20
    assert "from source" in first.stdout and "from source" not in second.stdout
    first_id = query(db, "SELECT run_id FROM runs ORDER BY started_ns")[0][0]
    for shown in (cli("show", first_id, "--db", str(db)), cli("show", "latest", "--db", str(db))):
        assert shown.returncode == 0, shown.stderr
        assert "Python modules compiled from source" not in shown.stdout
    note = "bytecode: Python's bytecode writing was off and torch's was not cached"
    assert note in " ".join(cli("show", first_id, "--db", str(db)).stdout.split())
