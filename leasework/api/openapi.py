"""The OpenAPI 3.1 description served at ``/openapi.json``, built from the loaded app: every job
type's payload JSON Schema (from its pydantic ``TypeAdapter``) is part of the submit schema,
discriminated by ``type``, so a client can generate or check a request for each type."""

from __future__ import annotations

from typing import Any

import pydantic

from leasework.api.openapi_operators import OPERATOR_SCHEMAS, operator_paths
from leasework.api.openapi_parts import REF, nullable
from leasework.api.openapi_parts import json_response as _json
from leasework.api.openapi_parts import problem as _problem
from leasework.api.openapi_parts import ref as _ref
from leasework.api.scopes import OPERATION_SCOPES
from leasework.app import App, JobType
from leasework.states import RETRYABLE, Status
from leasework.submission import MAX_ATTEMPTS, MAX_BATCH, MAX_DELAY_SECONDS, MAX_TIMEOUT_SECONDS

_JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}
_NULLABLE_STRING = {"type": ["string", "null"]}

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
STORABLE = {
    "description": "any JSON the job store can keep: no NUL character in a key or a string",
    "anyOf": [
        {"type": ["null", "boolean", "number"]},
        {"type": "string", "pattern": NO_NUL},
        {"type": "array", "items": {"$ref": "#/components/schemas/Storable"}},
        {
            "type": "object",
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": {"$ref": "#/components/schemas/Storable"},
        },
    ],
}


def storable(schema: Any) -> Any:
    """``schema`` with every string and key it admits free of NUL (pure; a copy): what the
    api enforces at every door (:mod:`leasework.jsonlimits`), stated in the document."""
    if isinstance(schema, list):
        return [storable(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: storable(v) for k, v in schema.items()}
    kinds = out.get("type")
    kinds = [kinds] if isinstance(kinds, str) else (kinds or [])
    if "string" in kinds and not {"pattern", "enum", "const", "format"} & set(out):
        out["pattern"] = NO_NUL
    if ("object" in kinds or "properties" in out) and out.get("additionalProperties") is not False:
        out.setdefault("propertyNames", {"pattern": NO_NUL})
        out.setdefault("additionalProperties", {"$ref": REF.format(model="Storable")})
    if "array" in kinds and "prefixItems" not in out:
        out.setdefault("items", {"$ref": REF.format(model="Storable")})
    return out


# optional fields: null is taken as left out (the api's defaults apply)
SUBMIT_OPTIONS: dict[str, Any] = {
    "run_at": nullable(TIME_SCHEMA),
    "delay_seconds": nullable({"type": "number", "minimum": 0, "maximum": MAX_DELAY_SECONDS}),
    "max_attempts": nullable({"type": "integer", "minimum": 1, "maximum": MAX_ATTEMPTS}),
    "timeout_seconds": nullable({"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_SECONDS}),
    "ordering_key": nullable(
        {"type": "string", "minLength": 1, "maxLength": 200, "pattern": NO_NUL}
    ),
}
IDEMPOTENCY_KEY = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": NO_NUL}


def _submit_schema(job_type: JobType, payload: dict, *, batch_item: bool) -> dict:
    properties: dict[str, Any] = {
        "type": {"const": job_type.name},
        "payload": payload,
        **SUBMIT_OPTIONS,
    }
    if batch_item:
        properties["idempotency_key"] = nullable(IDEMPOTENCY_KEY)
    required = ["type"]
    if job_type.payload_errors({}):  # the payload has required fields: it cannot be left out
        required.append("payload")
    return {
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": properties,
        # run_at and delay_seconds exclude each other
        "not": {"required": ["run_at", "delay_seconds"]},
        **({"description": job_type.description} if job_type.description else {}),
    }


def _payload_schemas(app: App) -> tuple[dict[str, dict], dict[str, dict]]:
    """(type name -> payload schema, shared definitions for components)."""
    typed = [(t.name, "validation", t.adapter) for t in app if t.adapter is not None]
    schemas, top = pydantic.TypeAdapter.json_schemas(typed, ref_template=REF) if typed else ({}, {})
    by_type = {name: schemas[(name, "validation")] for name, _, _ in typed}
    for t in app:
        by_type.setdefault(t.name, {"$ref": REF.format(model="Storable")})
    return storable(by_type), storable(top.get("$defs", {}))


def openapi_document(app: App) -> dict:
    payloads, definitions = _payload_schemas(app)
    schemas: dict[str, Any] = dict(definitions)
    single_refs, batch_refs = [], []
    for job_type in app:
        name = f"Submit.{job_type.name}"
        schemas[name] = _submit_schema(job_type, payloads[job_type.name], batch_item=False)
        schemas[f"BatchItem.{job_type.name}"] = _submit_schema(
            job_type, payloads[job_type.name], batch_item=True
        )
        single_refs.append(_ref(name))
        batch_refs.append(_ref(f"BatchItem.{job_type.name}"))
    schemas["Submit"] = {"oneOf": single_refs} if single_refs else {"not": {}}
    schemas["BatchItem"] = {"oneOf": batch_refs} if batch_refs else {"not": {}}
    schemas.update(COMMON_SCHEMAS)
    schemas.update(storable(OPERATOR_SCHEMAS))
    schemas["Storable"] = STORABLE
    document = {
        "openapi": "3.1.0",
        "info": {
            "title": "leasework",
            "version": "0.2.0",
            "description": f"Submit jobs of app {app.name}; workers run them under a fenced "
            "lease. Types: " + (", ".join(app.names) or "none"),
        },
        "paths": secured(paths() | operator_paths()),
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an API token (`leasework token create`); each operation "
                    "names the scope it needs in `x-leasework-scope` (admin allows all)",
                }
            },
        },
        "security": [{"bearer": []}],
    }
    return document


# Which scope each operation needs is leasework.api.scopes.OPERATION_SCOPES (None: public). Every
# operation must be listed (an endpoint cannot be added unprotected: :func:`secured` raises,
# and so does the api's route table).

_REFUSALS = {
    "401": _problem("No token, or a malformed, unknown or revoked one (`WWW-Authenticate`)"),
    "403": _problem("The token lacks this operation's scope (`required_scope` names it)"),
    "429": {
        **_problem("The token's rate limit is spent"),
        "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}},
    },
}

_BODY_REFUSALS = {
    "408": _problem("The body did not arrive within the read timeout"),
    "413": _problem("The body is over this endpoint's cap (`limit_bytes` says it)"),
}
_BUSY = _problem("Too many large bodies are being read at once; retry (`Retry-After`)")
LARGE_BODY_ROUTES = {("/jobs/batch", "post")}


def secured(document_paths: dict) -> dict:
    """Each operation with its ``x-leasework-scope``, its ``security`` (``[]`` when public)
    and the guard's 401, 403 and 429 answers."""
    for template, operations in document_paths.items():
        for method, operation in operations.items():
            if (template, method) not in OPERATION_SCOPES:
                raise KeyError(f"{method.upper()} {template} has no entry in OPERATION_SCOPES")
            scope = OPERATION_SCOPES[(template, method)]
            if scope is None:
                operation["security"] = []
            else:
                operation["x-leasework-scope"] = scope
                operation["description"] = (
                    operation.get("description", "") + f" Needs scope `{scope}` (or admin)."
                ).strip()
                operation["responses"] = {**operation["responses"], **_REFUSALS}
            # the guard's bounds on every request's body (leasework.api.limits)
            operation["responses"] = {**_BODY_REFUSALS, **operation["responses"]}
            if (template, method) in LARGE_BODY_ROUTES:
                operation["responses"].setdefault("503", _BUSY)
    return document_paths


def paths() -> dict:
    return {
        "/jobs": {
            "post": {
                "summary": "Submit a job",
                "parameters": [
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "schema": IDEMPOTENCY_KEY,
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("Submit")}},
                },
                "responses": {
                    "202": _json(_ref("Accepted"), "Accepted (or replayed under the same key)"),
                    "400": _problem("Malformed JSON"),
                    "409": _problem("Idempotency-Key reused with a different body"),
                    "413": _problem("Body too large"),
                    "415": _problem("Not application/json"),
                    "422": _problem("Invalid fields; `errors` names each"),
                    "503": _problem("Database unavailable; retry with the same key"),
                },
            },
            "get": {
                "summary": "List jobs, newest first",
                "parameters": [
                    {
                        "name": "status",
                        "in": "query",
                        "schema": {"type": "string", "enum": [s.value for s in Status]},
                    },
                    {
                        "name": "type",
                        "in": "query",
                        "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,100}$"},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 200},
                    },
                    {
                        "name": "cursor",
                        "in": "query",
                        "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,400}$"},
                        "description": "opaque: a previous page's next_cursor, unchanged; "
                        "any other value is a 400",
                    },
                ],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "jobs": {"type": "array", "items": _ref("Job")},
                                "next_cursor": _NULLABLE_STRING,
                            },
                        },
                        "A page of jobs",
                    ),
                    "400": _problem("Bad cursor"),
                    "422": _problem("Invalid filter"),
                },
            },
        },
        "/jobs/batch": {
            "post": {
                "summary": f"Submit up to {MAX_BATCH} jobs in one transaction, all or nothing",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["jobs"],
                                "additionalProperties": False,
                                "properties": {
                                    "jobs": {
                                        "type": "array",
                                        "minItems": 1,
                                        "maxItems": MAX_BATCH,
                                        "items": _ref("BatchItem"),
                                    }
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "202": _json(
                        {
                            "type": "object",
                            "properties": {"jobs": {"type": "array", "items": _ref("Accepted")}},
                        },
                        "Every job accepted, in request order",
                    ),
                    "400": _problem("Malformed JSON"),
                    "409": _problem("An item's idempotency key was used for another request"),
                    "413": _problem("Body too large"),
                    "415": _problem("Not application/json"),
                    "422": _problem("Invalid items; `errors` names each by index"),
                    "503": _problem("Database unavailable; nothing was written"),
                },
            }
        },
        "/jobs/retry": {
            "post": {
                "summary": "Retry dead or cancelled jobs matching a filter",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("RetryFilter")}},
                },
                "responses": {
                    "200": _json(
                        {"type": "object", "properties": {"retried": {"type": "integer"}}},
                        "How many jobs were put back in the queue",
                    ),
                    "400": _problem("Malformed JSON"),
                    "415": _problem("Not application/json"),
                    "422": _problem("Invalid filter"),
                },
            }
        },
        "/jobs/{job_id}": {
            "get": {
                "summary": "Get a job",
                "parameters": [_JOB_ID],
                "responses": {
                    "200": _json(_ref("Job"), "The job"),
                    "404": _problem("No such job"),
                },
            }
        },
        "/jobs/{job_id}/cancel": {
            "post": {
                "summary": "Cancel a job",
                "parameters": [_JOB_ID],
                "responses": {
                    "200": _json(_ref("Job"), "Cancelled (it was waiting)"),
                    "202": _json(_ref("Job"), "Cancel requested from the running worker"),
                    "404": _problem("No such job"),
                    "409": _problem("Already finished"),
                },
            }
        },
        "/jobs/{job_id}/retry": {
            "post": {
                "summary": "Retry a dead or cancelled job with a fresh attempt budget",
                "parameters": [_JOB_ID],
                "responses": {
                    "200": _json(_ref("Job"), "Queued again"),
                    "404": _problem("No such job"),
                    "409": _problem("Not dead or cancelled"),
                },
            }
        },
        "/job-types": {
            "get": {
                "summary": "The job types of the loaded app, with payload schemas and policy",
                "responses": {"200": {"description": "the types"}},
            }
        },
        "/healthz": {
            "get": {"summary": "Liveness", "responses": {"200": {"description": "alive"}}}
        },
        "/readyz": {
            "get": {
                "summary": "Readiness",
                "responses": {
                    "200": {"description": "ready"},
                    "503": {"description": "names the unreachable dependency"},
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {"200": {"description": "text format"}},
            }
        },
    }


COMMON_SCHEMAS: dict[str, Any] = {
    "Accepted": {
        "type": "object",
        "required": ["id", "type", "status", "run_at", "created_at", "replay"],
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "type": {"type": "string"},
            "status": {"type": "string", "enum": [s.value for s in Status]},
            "run_at": {"type": "string", "format": "date-time"},
            "created_at": {"type": "string", "format": "date-time"},
            "max_attempts": {"type": "integer"},
            "timeout_seconds": {"type": "integer"},
            "ordering_key": _NULLABLE_STRING,
            "replay": {"type": "boolean"},
        },
    },
    "Job": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "type": {"type": "string"},
            "payload": {},
            "status": {"type": "string", "enum": [s.value for s in Status]},
            "attempt": {"type": "integer"},
            "max_attempts": {"type": "integer"},
            "timeout_seconds": {"type": "integer"},
            "ordering_key": _NULLABLE_STRING,
            "last_error": _NULLABLE_STRING,
            "cancel_requested": {"type": "boolean"},
            "result": {"description": "the handler's return value, once succeeded"},
            "deferrals": {"type": "integer"},
            "run_at": {"type": "string"},
            "created_at": {"type": "string"},
            "updated_at": {"type": "string"},
            "started_at": _NULLABLE_STRING,
            "finished_at": _NULLABLE_STRING,
        },
    },
    "RetryFilter": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "status": nullable({"type": "string", "enum": sorted(RETRYABLE), "default": "dead"}),
            "type": nullable({"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,100}$"}),
            "finished_after": nullable(TIME_SCHEMA),
            "finished_before": nullable(TIME_SCHEMA),
            "limit": nullable({"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000}),
        },
    },
    "Problem": {
        "type": "object",
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "instance": {"type": "string"},
            "errors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "field": {"type": "string"},
                        "message": {"type": "string"},
                    },
                },
            },
        },
    },
}
