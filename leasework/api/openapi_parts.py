"""Small builders for the OpenAPI document: a problem answer, a JSON answer, a reference."""

from __future__ import annotations

REF = "#/components/schemas/{model}"
_PROBLEM = {"$ref": "#/components/schemas/Problem"}


def problem(description: str) -> dict:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": _PROBLEM}},
    }


def json_response(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def ref(name: str) -> dict:
    return {"$ref": REF.format(model=name)}


def nullable(schema: dict) -> dict:
    """``schema`` or null: an optional field the api takes null for as left out."""
    out = dict(schema)
    if isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if "enum" in out:
        out["enum"] = [*out["enum"], None]
    if "const" in out or "type" not in out:
        return {"anyOf": [schema, {"type": "null"}]}
    return out
