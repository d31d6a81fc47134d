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
