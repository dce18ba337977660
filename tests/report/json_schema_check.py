"""A JSON Schema checker for the subset the output schemas use (type, enum, const, required,
properties, additionalProperties, items, minimum, $ref into $defs); raises AssertionError
naming the path of the first value off the schema."""

from __future__ import annotations

from typing import Any

_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def _is(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


def validate(value: Any, schema: dict, root: dict | None = None, path: str = "$") -> None:
    root = schema if root is None else root
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        return validate(value, root["$defs"][name], root, path)
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        assert any(_is(value, t) for t in types), f"{path}: {value!r} is not {types}"
    if "enum" in schema:
        assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    if "const" in schema:
        assert value == schema["const"], f"{path}: {value!r} is not {schema['const']!r}"
    if "minimum" in schema and _is(value, "number"):
        assert value >= schema["minimum"], f"{path}: {value!r} < {schema['minimum']}"
    if isinstance(value, dict):
        for key in schema.get("required", []):
            assert key in value, f"{path}: missing {key!r}"
        props = schema.get("properties", {})
        for key, item in value.items():
            if key in props:
                validate(item, props[key], root, f"{path}.{key}")
            else:
                assert schema.get("additionalProperties", True), f"{path}: unexpected {key!r}"
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            validate(item, schema["items"], root, f"{path}[{i}]")
    return None
