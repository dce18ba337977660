"""The README's scenario reference stays true to the schema: every key, with its default."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from mrv2_prof.scenario import Scenario
from mrv2_prof.scenario.keys import models_in as _models_in

README = Path(__file__).resolve().parents[1] / "README.md"


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


def readme_rows() -> dict[str, str]:
    text = README.read_text()
    section = text.split("### Scenario reference", 1)[1].split("\n###", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells[1]
    return rows


def test_every_scenario_key_is_documented_with_its_default():
    schema, readme = schema_keys(), readme_rows()
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

    files = sorted((README.parent / "scenarios").glob("*.yaml"))
    names = {f.stem for f in files}
    assert {
        "quickstart", "decode_heavy", "prefill_heavy", "mixed_poisson", "preemption_pressure",
        "prefix_sharing", "ablation_matrix",
    } <= names  # fmt: skip
    for f in files:
        load_scenario(f)
        comment = [line for line in f.read_text().splitlines() if line.startswith("#")]
        assert len(comment) >= 3, f"{f.name}: needs a comment block saying what it shows"
        assert f"`{f.name}`" in README.read_text()
