"""Values a JSON Schema allows, as a hypothesis strategy, for the subset our documents use.

hypothesis-jsonschema would be the field's library, but its last release (0.23.1) calls a
hypothesis internal that the pinned hypothesis no longer has; the subset InferGrid's own
documents use is small: type (one or a list), properties/required/additionalProperties,
items/minItems/maxItems, enum/const, minimum/maximum/exclusiveMinimum,
minLength/maxLength, anyOf/oneOf. A schema keyword outside it is an error here, so a
document cannot silently outgrow what its fuzzer draws.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

KNOWN = {
    "type", "properties", "required", "additionalProperties", "items", "minItems",
    "maxItems", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "minLength",
    "maxLength", "anyOf", "oneOf", "description", "title", "default", "examples", "format",
}  # fmt: skip
_TEXT = st.text(st.characters(codec="utf-8"), max_size=24)


def from_schema(schema: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    unknown = set(schema) - KNOWN
    if unknown:
        raise ValueError(f"schema keywords the fuzzer cannot draw: {sorted(unknown)}")
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(s) for s in schema[key]])
    types = schema.get("type", ["null", "boolean", "integer", "number", "string"])
    types = [types] if isinstance(types, str) else types
    return st.one_of([_typed(t, schema) for t in types])


def _typed(kind: str, schema: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    if kind == "object":
        return _object(schema)
    if kind == "array":
        items = from_schema(schema.get("items", {}))
        return st.lists(items, min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", 4), 4))  # fmt: skip
    if kind == "string":
        low, high = schema.get("minLength", 0), min(schema.get("maxLength", 24), 24)
        return (
            _TEXT.filter(lambda s: low <= len(s) <= high) if low else _TEXT.map(lambda s: s[:high])
        )
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        return st.floats(low, schema.get("maximum"), allow_nan=False, allow_infinity=False,
                         exclude_min="exclusiveMinimum" in schema)  # fmt: skip
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    raise ValueError(f"schema type the fuzzer cannot draw: {kind!r}")


@st.composite
def _object(draw: st.DrawFn, schema: Mapping[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties", {})
    required = set(schema.get("required", ()))
    out = {}
    for name, sub in properties.items():
        if name in required or draw(st.booleans()):
            out[name] = draw(from_schema(sub))
    return out
