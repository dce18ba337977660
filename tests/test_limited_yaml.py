"""YAML for user input: PyYAML's safe loader with duplicate keys, depth and alias expansion
limited."""

from __future__ import annotations

import pytest

from mrv2_prof.inputs import limited_yaml
from mrv2_prof.inputs.limited_yaml import MAX_DEPTH, MAX_NODES, YamlError, load


def test_plain_yaml_loads_as_safe_load_does():
    text = "a: 1\nb: [x, 2.5, true, null]\nc: {d: e}\n"
    assert load(text) == {"a": 1, "b": ["x", 2.5, True, None], "c": {"d": "e"}}
    assert load("") is None


def test_small_aliases_and_merge_keys_still_work():
    text = "base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\nlist: [*b, *b]\n"
    data = load(text)
    assert data["other"] == {"x": 1, "y": 3}
    assert data["list"] == [{"x": 1, "y": 2}] * 2


@pytest.mark.parametrize(
    ("text", "line"),
    [("a: 1\nb: 2\na: 3\n", 3), ("x: {k: 1, k: 2}\n", 1), ("1: a\n1: b\n", 2)],
)
def test_a_key_given_twice_is_an_error_with_its_line(text, line):
    with pytest.raises(YamlError, match="given twice") as info:
        load(text)
    assert info.value.line == line


def test_depth_is_bounded():
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert load(ok) is not None
    with pytest.raises(YamlError, match=f"nested more than {MAX_DEPTH}"):
        load("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    with pytest.raises(YamlError, match="nested"):
        load("a:\n" + "".join("  " * i + "- \n" for i in range(1, 200)))


def test_alias_expansion_is_bounded_by_the_tree_it_stands_for():
    # 10 aliases of a 10-item list = 111 values: fine; nested six deep = 10**6: refused.
    fine = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\nb: [" + ", ".join(["*a"] * 10) + "]\n"
    assert len(load(fine)["b"]) == 10
    levels = ["l0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    levels += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 6)]
    with pytest.raises(YamlError, match=f"more than {MAX_NODES:,} values"):
        load("\n".join(levels) + "\n")


def test_a_huge_flat_document_is_refused_too(monkeypatch):
    monkeypatch.setattr(limited_yaml, "MAX_NODES", 50)
    with pytest.raises(YamlError, match="more than 50 values"):
        load("[" + ", ".join(["1"] * 60) + "]")


def test_syntax_errors_keep_their_line():
    with pytest.raises(YamlError, match="YAML syntax error") as info:
        load("a: 1\nb: [2\n")
    assert info.value.line is not None
