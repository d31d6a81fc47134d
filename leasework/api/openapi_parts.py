"""Small builders for the OpenAPI document (a problem answer, a JSON answer, a reference) and
the schemas its operations share."""

from __future__ import annotations

from leasework.job import MAX_KEY_CHARS, TYPE_NAME_REGEX

REF = "#/components/schemas/{model}"
_PROBLEM = {"$ref": "#/components/schemas/Problem"}

JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}
NULLABLE_STRING = {"type": ["string", "null"]}
TYPE_NAME = {"type": "string", "pattern": TYPE_NAME_REGEX}

# a time the api takes: RFC 3339, a real date, an offset under 16 hours (what Postgres keeps)
TIME_SCHEMA = {
    "type": "string",
    "format": "date-time",
    "pattern": r"^(?!0000)\d{4}-\d{2}-\d{2}[Tt]([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?"
    r"([Zz]|[+-](0\d|1[0-5]):[0-5]\d)$",
    "description": "RFC 3339 with an offset (under 16 hours), e.g. 2026-01-02T03:04:05Z",
}
# the job store keeps no NUL character in any text (a key or a string)
NO_NUL = "^[^\u0000]*$"
IDEMPOTENCY_KEY = {"type": "string", "minLength": 1, "maxLength": MAX_KEY_CHARS, "pattern": NO_NUL}


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
