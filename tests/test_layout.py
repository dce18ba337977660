"""The import rules of docs/architecture.md ("Folders and who may import whom"), read from the
source with ``ast`` (function-level imports included), and the module size limit.

A node of the import graph is a folder of ``mrv2_prof`` (``runner``, ``probes``, ``store``,
``report``, ``tui``, ``pipeline``, ``analysis``, ...) or one top-level module (``__main__``, ...).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mrv2_prof"
MAX_LINES = 450
VIEWS = ("report", "tui", "views", "analysis")
# the modules left at the package root, each with its reason (docs/architecture.md)
ROOT_MODULES = {"__init__", "__main__", "entry_messages"}


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path) -> set[str]:
    """Absolute names of everything ``path`` imports (relative imports resolved)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names.add(prefix)
            # ``from pkg import module`` imports that module too
            names.update(f"{prefix}.{alias.name}" for alias in node.names)
    return names


MODULES = _modules()
IMPORTS = {m: _imports(m, p) for m, p in MODULES.items()}


def _internal(names: set[str]) -> set[str]:
    """The imported names that are modules of the package."""
    return {n for n in names if n in MODULES}


def _node(module: str) -> str:
    """``mrv2_prof.runner.worker.x`` -> ``runner``; ``mrv2_prof.cli`` -> ``cli``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "mrv2_prof"


def _in(module: str, node: str) -> bool:
    return _node(module) == node


def test_the_graph_sees_known_edges():
    """Calibrates the parser: edges that exist by design are found."""
    assert "mrv2_prof.probes.api" in _internal(IMPORTS["mrv2_prof.runner.engine"])
    assert "mrv2_prof.runner.engine" in _internal(IMPORTS["mrv2_prof.pipeline.harness"])


def test_runner_imports_only_probes_api_from_the_instrumentation():
    bad = [
        f"{m} imports {n}"
        for m, names in IMPORTS.items()
        if _in(m, "runner")
        for n in _internal(names)
        if not _in(n, "runner")
        and n not in ("mrv2_prof.probes", "mrv2_prof.probes.api", "mrv2_prof.inputs.input_file")
        and n != "mrv2_prof"
    ]
    assert bad == []


@pytest.mark.parametrize("folder", ["store", "report"])
def test_store_and_report_import_neither_torch_nor_the_runner(folder):
    bad = [
        f"{m} imports {n}"
        for m, names in IMPORTS.items()
        if _in(m, folder)
        for n in names
        if n.split(".")[0] in ("torch", "triton") or n.startswith("mrv2_prof.runner")
    ]
    assert bad == []


def _module_level_imports(path: Path) -> set[str]:
    """Names imported by the module's own top-level statements (not inside functions)."""
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module or "")
    return names


def test_text_imports_no_torch_and_the_runner_only_inside_functions():
    """text/ (the tokenizer and chat templates) loads in the parent before any model: no torch
    anywhere, the runner's model tables only inside ``tokenizer_for``."""
    torch = [
        f"{m} imports {n}"
        for m, names in IMPORTS.items()
        if _in(m, "text")
        for n in names
        if n.split(".")[0] in ("torch", "triton")
    ]
    runner = [
        f"{m} imports {n} at module level"
        for m, path in MODULES.items()
        if _in(m, "text")
        for n in _module_level_imports(path)
        if n.startswith("mrv2_prof.runner")
    ]
    assert torch + runner == []
    assert any(_in(m, "text") for m in MODULES)


def test_views_never_import_the_runner():
    bad = [
        f"{m} imports {n}"
        for m, names in IMPORTS.items()
        if _node(m) in VIEWS
        for n in names
        if n.startswith("mrv2_prof.runner")
    ]
    assert bad == []


def test_analysis_imports_no_view_and_no_command():
    """``analysis/`` computes what the views render: it never imports ``report/``, ``tui/`` or
    ``cli/`` (``views/``' formatting helpers it may use)."""
    bad = [
        f"{m} imports {n}"
        for m, names in IMPORTS.items()
        if _in(m, "analysis")
        for n in _internal(names)
        if _node(n) in ("report", "tui", "cli")
    ]
    assert bad == []


def test_no_module_imports_another_modules_private_name():
    """What one module needs of another is a public name: no ``from x import _name``."""
    bad = []
    for m, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.level or "mrv2_prof" in node.module):
                names = [a.name for a in node.names]
                bad += [
                    f"{m} imports {node.module}.{n}"
                    for n in names
                    if n.startswith("_") and not n.startswith("__")
                ]
    assert bad == []


def test_no_two_folders_import_each_other():
    edges = {
        (_node(m), _node(n))
        for m, names in IMPORTS.items()
        for n in _internal(names)
        if _node(m) != _node(n) and "mrv2_prof" not in (_node(m), _node(n))
    }
    both_ways = sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges and a < b)
    assert both_ways == []


PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def _member(module: str, level: str) -> str:
    """The child of package ``level`` that holds ``module``: a sub-folder or a module."""
    return f"{level}.{module[len(level) + 1 :].split('.')[0]}"


def _sibling_edges(imports: dict[str, set[str]], modules: set[str]) -> set[tuple[str, str]]:
    """Every import between two modules, lifted to the level where they part: the children of
    their deepest common package that hold them (``runner.worker.spec_decode.verify`` importing
    ``runner.worker.input_batch`` is the edge ``runner.worker.spec_decode`` ->
    ``runner.worker.input_batch``). A module importing its own package, or a package its own
    module, is inside one node and no edge."""
    edges = set()
    for m, names in imports.items():
        for n in names & modules:
            if n == m or n.startswith(f"{m}.") or m.startswith(f"{n}."):
                continue
            a, b = m.split("."), n.split(".")
            common = 0
            while a[common] == b[common]:
                common += 1
            level = ".".join(a[:common])
            edges.add((_member(m, level), _member(n, level)))
    return edges


def _folder_cycles(
    imports: dict[str, set[str]], modules: set[str], packages: set[str]
) -> list[list[str]]:
    """The import cycles, among the children of any one package, that pass through a folder
    (sub-packages taken whole, with everything below them): the strongly connected components
    of more than one node holding a folder. Module-level and function-level imports alike."""
    graph: dict[str, set[str]] = {}
    for a, b in _sibling_edges(imports, modules):
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1 and any(c in packages for c in component):
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def _two_way(imports: dict[str, set[str]], modules: set[str], packages: set[str]) -> list[str]:
    """Two children of one package that import each other, one of them a folder."""
    edges = _sibling_edges(imports, modules)
    return sorted(
        f"{a} <-> {b}"
        for a, b in edges
        if a < b and (b, a) in edges and (a in packages or b in packages)
    )


def test_the_cycle_check_finds_cycles_through_folders():
    """Calibrates the cycle checks on a made-up package: a folder and a module beside it that
    import each other (one way inside a function, as ``_imports`` reads it), a cycle inside a
    folder through a folder nested in it, a longer cycle of folders, and what is none."""
    pkg = {"p", "p.a", "p.b", "p.b.c", "p.d", "p.e", "p.f"}
    mods = pkg | {"p.top", "p.a.x", "p.a.y", "p.b.z", "p.b.c.w", "p.m1", "p.m2"}
    mods |= {"p.d.i", "p.e.i", "p.f.i"}
    imports = {
        "p.top": {"p.a.x", "p.b.z", "p.m2"},
        "p.a.x": {"p.m1", "p.a", "p.a.y"},  # its own package: no edge
        "p.m1": {"p.a.y"},  # closes p.a <-> p.m1
        "p.b.c.w": {"p.b.z"},  # a nested folder and its parent's module: one level down
        "p.b.z": {"p.b.c.w"},
        "p.m2": {"p.top"},  # modules only: no folder rule's business
        "p.d.i": {"p.e.i"},  # p.d -> p.e -> p.f -> p.d: three folders, no two both ways
        "p.e.i": {"p.f"},
        "p.f.i": {"p.d.i"},
    }
    assert _folder_cycles(imports, mods, pkg) == [
        ["p.a", "p.m1"],
        ["p.b.c", "p.b.z"],
        ["p.d", "p.e", "p.f"],
    ]
    assert _two_way(imports, mods, pkg) == ["p.a <-> p.m1", "p.b.c <-> p.b.z"]


def test_no_folder_and_a_neighbour_import_each_other():
    """At every level of the package, a folder and a folder or module beside it never import
    each other (function-level imports included): docs/architecture.md, "Folders and who may
    import whom"."""
    assert _two_way(IMPORTS, set(MODULES), PACKAGES) == []


def test_the_runner_folders_form_a_tree():
    """Inside ``runner/`` no import cycle of any length passes through a folder: ``engine`` over
    ``worker/`` (speculative decoding nested in it, ``worker/spec_decode/``), over
    ``parallel/``, ``core/`` and ``model/``, with ``config.py`` at the bottom."""
    cycles = _folder_cycles(IMPORTS, set(MODULES), PACKAGES)
    assert [c for c in cycles if c[0].startswith("mrv2_prof.runner.")] == []
    config = _internal(IMPORTS["mrv2_prof.runner.config"])
    assert {n for n in config if n.startswith("mrv2_prof.runner")} == set()


def test_no_import_cycle_passes_through_a_folder_anywhere():
    """The package's top-level folders form a tree as the runner's do: views and the analysis
    read a stored environment through ``views/environment.py``, not the pipeline that records
    it, so ``analysis -> pipeline -> tui -> analysis`` cannot close again."""
    assert _folder_cycles(IMPORTS, set(MODULES), PACKAGES) == []


def test_no_module_is_over_the_size_limit():
    lines = {
        str(p.relative_to(PACKAGE.parent)): len(p.read_text().splitlines())
        for p in MODULES.values()
    }
    assert {f: n for f, n in lines.items() if n > MAX_LINES} == {}


def test_no_comment_cites_a_file_outside_the_repository():
    cites = [
        f"{p.relative_to(PACKAGE.parent)}:{i}"
        for p in MODULES.values()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "DESIGN §" in line or "shared/" in line
    ]
    assert cites == []


def test_the_package_root_holds_only_the_modules_the_doc_lists():
    found = {p.stem for p in PACKAGE.glob("*.py")}
    assert found == ROOT_MODULES
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    assert all(f"{name}.py" in doc for name in ROOT_MODULES - {"__init__"})


# The latency definitions' SQL (analysis/latency.py), each marker as the normalised source spells
# it: TTFT, TPOT, E2E, the ITL gap, the completed-request filter.
LATENCY_DEFINITIONS = "mrv2_prof.analysis.latency"
LATENCY_MARKERS = (
    "first_token_ns-arrival_ns",
    "finish_ns-first_token_ns",
    "finish_ns-arrival_ns",
    "lag(t_ns)",
    "'stop','length'",
)


def _latency_markers(path: Path) -> set[str]:
    """The markers in ``path``'s source, lower case with whitespace and table qualifiers
    (``t.``, ``q.``) removed, so a reformatted or aliased copy is found too."""
    text = re.sub(r"\s+", "", path.read_text().lower())
    text = re.sub(r"\b[a-z_]\w*\.(?=[a-z_])", "", text)
    return {m for m in LATENCY_MARKERS if m in text}


def test_latency_is_defined_in_one_module():
    """TTFT, TPOT, ITL, E2E and the completed-request filter are spelled out only in
    ``analysis/latency.py``; every other module reads them from there, so no view's figure drifts
    from the summary's."""
    assert _latency_markers(MODULES[LATENCY_DEFINITIONS]) == set(LATENCY_MARKERS)
    copies = {
        m: sorted(found)
        for m, path in MODULES.items()
        if m != LATENCY_DEFINITIONS and (found := _latency_markers(path))
    }
    assert copies == {}


# SQL lives in store/ (the database itself) and analysis/ (what its rows mean); a view renders
# what analysis computes. A statement's keyword followed by a word it takes, upper case as the
# package writes SQL; docstrings are prose and not read.
SQL_HOMES = ("store", "analysis")
SQL = re.compile(
    r"\b(SELECT\s+[\w*(]|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+(TEMP\s+)?"
    r"(TABLE|INDEX|VIEW)|PRAGMA\s+\w)"
)


def _sql_sites(path: Path) -> list[str]:
    """``line: what`` for each SQL string and each ``.execute*(`` call in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    sites = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings and SQL.search(node.value):
                sites.append(f"{node.lineno}: {node.value.strip()[:40]!r}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("execute", "executemany", "sql")  # DuckDB and sqlite3
        ):
            sites.append(f"{node.lineno}: .{node.func.attr}(")
    return sites


def test_the_sql_check_finds_sql():
    """Calibrates ``_sql_sites``: a query, a statement, an execute call; not prose."""
    sample = PACKAGE.parent / "tests" / "layout_sql_sample.txt"
    code = (
        '"""Docs may say SELECT x FROM t."""\n'
        'Q = "SELECT run_id FROM runs"\n'
        "def f(con):\n"
        '    con.execute(f"INSERT INTO t VALUES ({1})")\n'
        'NOTE = "select a run"\n'
    )
    sample.write_text(code)
    try:
        found = _sql_sites(sample)
    finally:
        sample.unlink()
    assert sorted(s.split(":")[0] for s in found) == ["2", "4", "4"]


def test_no_sql_outside_the_store_and_analysis():
    """No view, command or pipeline module spells SQL or runs a query of its own."""
    sites = {
        m: _sql_sites(p) for m, p in MODULES.items() if _node(m) not in SQL_HOMES and _sql_sites(p)
    }
    assert sites == {}
