"""The OpenAPI 3.1 description served at ``/openapi.json``, built from the route table
(:data:`leasework.api.routes.ROUTES`: each route's operation, in the table's order, with its
scope) and the loaded app: every job type's payload JSON Schema (from its pydantic
``TypeAdapter``) is part of the submit schema, discriminated by ``type``, so a client can
generate or check a request for each type."""

from __future__ import annotations

from typing import Any

import pydantic

from leasework.api.limits import BodyKind
from leasework.api.openapi_jobs import unique_schema
from leasework.api.openapi_operators import OPERATOR_SCHEMAS
from leasework.api.openapi_parts import (
    IDEMPOTENCY_KEY,
    NO_NUL,
    NULLABLE_STRING,
    REF,
    TIME_SCHEMA,
    TYPE_NAME,
    nullable,
    problem,
    ref,
)
from leasework.api.openapi_schedules import schedule_schemas
from leasework.api.routes import ROUTES
from leasework.api.routing import Route
from leasework.app import App, JobType
from leasework.operations import API_BODY, BULK_RETRY_LIMIT
from leasework.queues import DEFAULT
from leasework.queues.priorities import HIGHEST, LOWEST
from leasework.states import RETRYABLE, Status
from leasework.submission import MAX_ATTEMPTS, MAX_DELAY_SECONDS, MAX_TIMEOUT_SECONDS

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
    if "string" in kinds and not {"enum", "const"} & set(out):
        if {"pattern", "format"} & set(out):  # a pattern of its own may admit NUL (a [^@] class)
            if {"pattern": NO_NUL} not in out.get("allOf", []):
                out["allOf"] = [*out.get("allOf", []), {"pattern": NO_NUL}]
        else:
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
    "priority": nullable(
        {
            "type": "integer",
            "minimum": HIGHEST,
            "maximum": LOWEST,
            "description": "0 is the highest, and the default (else its type's); under "
            "backlog a higher priority starts first, and a lower one waiting rises a level "
            "per second, so it is never starved",
        }
    ),
}


def queue_schema(job_type: JobType) -> dict[str, Any]:
    """A submit's ``queue``: the queues this type is known to use (its own and ``default``);
    any other queue that exists is taken too, one that does not is a 422."""
    names = sorted({DEFAULT, job_type.queue or DEFAULT})
    return {
        "type": "string",
        "enum": names,
        "description": "the queue the job waits in (default: its type's, else 'default'); "
        "any queue created with `leasework queues create` is taken",
    }


def _submit_schema(job_type: JobType, payload: dict, *, batch_item: bool) -> dict:
    properties: dict[str, Any] = {
        "type": {"const": job_type.name},
        "payload": payload,
        **SUBMIT_OPTIONS,
        "unique": nullable(unique_schema(job_type)),
        "queue": nullable(queue_schema(job_type)),
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
        single_refs.append(ref(name))
        batch_refs.append(ref(f"BatchItem.{job_type.name}"))
    schemas["Submit"] = {"oneOf": single_refs} if single_refs else {"not": {}}
    schemas["BatchItem"] = {"oneOf": batch_refs} if batch_refs else {"not": {}}
    schemas.update(COMMON_SCHEMAS)
    schemas.update(storable(OPERATOR_SCHEMAS))
    schemas.update(storable(schedule_schemas(app, payloads)))
    schemas["Storable"] = STORABLE
    document = {
        "openapi": "3.1.0",
        "info": {
            "title": "leasework",
            "version": "0.2.0",
            "description": f"Submit jobs of app {app.name}; workers run them under a fenced "
            "lease. Types: " + (", ".join(app.names) or "none"),
        },
        "paths": documented(ROUTES),
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


_REFUSALS = {
    "401": problem("No token, or a malformed, unknown or revoked one (`WWW-Authenticate`)"),
    "403": problem("The token lacks this operation's scope (`required_scope` names it)"),
    "429": {
        **problem("The token's rate limit is spent"),
        "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}},
    },
}

_BODY_REFUSALS = {
    "408": problem("The body did not arrive within the read timeout"),
    "413": problem("The body is over this endpoint's cap (`limit_bytes` says it)"),
}
_BUSY = problem("Too many large bodies are being read at once; retry (`Retry-After`)")
# the bodies whose cap (at the default settings) lets one hold a slot for large bodies
LARGE_BODIES = {BodyKind.BATCH}


def documented(routes: tuple[Route, ...]) -> dict:
    """The document's ``paths``: the operation of every route that has one, in the table's
    order, each secured (:func:`secured`)."""
    document_paths: dict[str, dict] = {}
    for route in routes:
        if route.doc is not None:
            document_paths.setdefault(route.path, {})[route.method.lower()] = secured(
                route, route.doc()
            )
    return document_paths


def secured(route: Route, operation: dict) -> dict:
    """``operation`` with its route's ``x-leasework-scope``, its ``security`` (``[]`` when
    public) and the guard's 401, 403 and 429 answers, and the guard's bounds on every
    request's body (:mod:`leasework.api.limits`)."""
    if route.scope is None:
        operation["security"] = []
    else:
        operation["x-leasework-scope"] = route.scope
        operation["description"] = (
            operation.get("description", "") + f" Needs scope `{route.scope}` (or admin)."
        ).strip()
        operation["responses"] = {**operation["responses"], **_REFUSALS}
    operation["responses"] = {**_BODY_REFUSALS, **operation["responses"]}
    if route.body in LARGE_BODIES:
        operation["responses"].setdefault("503", _BUSY)
    return operation


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
            "ordering_key": NULLABLE_STRING,
            "replay": {"type": "boolean"},
            "duplicate": {
                "type": "boolean",
                "description": "the job that holds the unique key the submit asked for: "
                "nothing was written",
            },
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
            "ordering_key": NULLABLE_STRING,
            "last_error": NULLABLE_STRING,
            "cancel_requested": {"type": "boolean"},
            "result": {"description": "the handler's return value, once succeeded"},
            "deferrals": {"type": "integer"},
            "schedule": {**NULLABLE_STRING, "description": "the schedule it came from"},
            "queue": {"type": "string", "description": "the named queue it waits in"},
            "priority": {
                "type": "integer",
                "minimum": HIGHEST,
                "maximum": LOWEST,
                "description": "its priority in the queue: 0, the highest, to 3",
            },
            "tick_at": {**NULLABLE_STRING, "description": "the nominal instant of its tick"},
            "run_at": {"type": "string"},
            "created_at": {"type": "string"},
            "updated_at": {"type": "string"},
            "started_at": NULLABLE_STRING,
            "finished_at": NULLABLE_STRING,
            "unique": {
                "type": ["object", "null"],
                "description": "the job's unique key (null: it asked for none)",
                "properties": {
                    "key": {"type": "string", "description": "sha256, hex"},
                    "states": {
                        "type": "array",
                        "items": {"type": "string", "enum": [s.value for s in Status]},
                        "description": "the states in which the job holds its key",
                    },
                    "holds": {"type": "boolean", "description": "it holds the key now"},
                },
            },
        },
    },
    "RetryFilter": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "status": nullable({"type": "string", "enum": sorted(RETRYABLE), "default": "dead"}),
            "type": nullable(TYPE_NAME),
            "finished_after": nullable(TIME_SCHEMA),
            "finished_before": nullable(TIME_SCHEMA),
            "limit": nullable(
                {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": BULK_RETRY_LIMIT,
                    "default": API_BODY.default_limit,
                }
            ),
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
