"""The import rules of docs/architecture.md ("Folders and who may import whom"), read from the
source with ``ast`` (function-level imports included), and the module size limit.

A node of the import graph is a folder of ``mrv2_prof`` (``runner``, ``probes``, ``store``,
``report``, ``tui``, ``pipeline``, ``analysis``, ...) or one top-level module (``__main__``, ...).
"""

from __future__ import annotations

import ast
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


def test_no_two_folders_import_each_other():
    edges = {
        (_node(m), _node(n))
        for m, names in IMPORTS.items()
        for n in _internal(names)
        if _node(m) != _node(n) and "mrv2_prof" not in (_node(m), _node(n))
    }
    both_ways = sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges and a < b)
    assert both_ways == []


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
