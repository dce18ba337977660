"""YAML for user input (scenarios, ``--set`` values, gate thresholds): PyYAML's safe loader
with limits, so a small file cannot become a huge or endlessly deep value.

* a mapping key given twice is an error (PyYAML lets the last one win silently);
* nesting deeper than ``MAX_DEPTH`` is an error (found while composing, before Python's
  recursion limit is near);
* an integer of more digits than Python converts (``sys.get_int_max_str_digits``) is an
  error naming its line, not a ValueError from ``int()``;
* aliases are expanded at most to ``MAX_NODES`` values in all: an alias is a reference, so the
  composed document is measured as the tree it stands for (a "billion laughs" document of nine
  nested aliases is a few hundred bytes and a billion values).

``load`` returns plain Python data; every problem is a ``YamlError`` with the line.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

MAX_DEPTH = 64  # mappings and lists inside each other
MAX_NODES = 100_000  # values in the document once its aliases are expanded
_MERGE = "tag:yaml.org,2002:merge"  # `<<: *base`, a key that may repeat what it merges


class YamlError(ValueError):
    """A YAML text that cannot be used; ``line`` (1-based, or None) and ``problem``."""

    def __init__(self, problem: str, line: int | None = None) -> None:
        self.problem, self.line = problem, line
        super().__init__(f"line {line}: {problem}" if line is not None else problem)


def _line(node_or_event: Any) -> int | None:
    mark = getattr(node_or_event, "start_mark", None)
    return mark.line + 1 if mark is not None else None


class _LimitedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlError(
                    f"nested more than {MAX_DEPTH} levels deep", _line(self.peek_event())
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> Any:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # more digits than int() converts
            digits = sum(c.isdigit() for c in str(node.value))
            most = sys.get_int_max_str_digits()
            problem = f"an integer of {digits:,} digits (at most {most:,})"
            raise YamlError(problem, _line(node)) from None

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int | None] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
                    continue  # merge keys and complex keys: PyYAML's own rules
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise YamlError(
                        f"key {key!s:.60} given twice (first on line {seen[key]})",
                        _line(key_node),
                    )
                seen[key] = _line(key_node)
        return super().construct_mapping(node, deep=deep)


_LimitedLoader.add_constructor("tag:yaml.org,2002:int", _LimitedLoader.construct_yaml_int)


def _expanded_size(node: Any, sizes: dict[int, int]) -> int:
    """Values ``node`` stands for with every alias expanded (shared nodes counted per use);
    memoised by node, so measuring a bomb costs its composed size, not its expansion."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    sizes[id(node)] = MAX_NODES + 1  # a cycle (a recursive alias) counts as too large
    total = 1
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            total += _expanded_size(child, sizes)
            if total > MAX_NODES:
                break
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            total += _expanded_size(key, sizes) + _expanded_size(value, sizes)
            if total > MAX_NODES:
                break
    sizes[id(node)] = total
    return total


def load(text: str) -> Any:
    """The single YAML document in ``text`` as Python data (None when empty)."""
    loader = _LimitedLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlError(f"nested more than {MAX_DEPTH} levels deep") from None
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_NODES:
            raise YamlError(
                f"expands to more than {MAX_NODES:,} values (YAML aliases or a huge document)",
                _line(node),
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YamlError(f"YAML syntax error: {problem}", mark.line + 1 if mark else None) from None
    finally:
        loader.dispose()
