"""The OpenAPI operations and schemas of the operators' endpoints
(:mod:`leasework.api.operators`): tokens, the audit log, workers, Alertmanager's webhook. Each
operation is one function, named beside its handler in the route table
(:data:`leasework.api.routes.ROUTES`)."""

from __future__ import annotations

from typing import Any

from leasework.api.openapi_parts import json_response, nullable, problem, ref
from leasework.tokens import SCOPES, TOKEN_NAME_PATTERN

TOKEN = ref("Token")


def list_tokens() -> dict:
    """GET ``/tokens``."""
    return {
        "summary": "List API tokens (never their secrets)",
        "parameters": [
            {
                "name": "revoked",
                "in": "query",
                "schema": {"type": "string", "enum": ["true", "false"]},
                "description": "true: include revoked tokens",
            }
        ],
        "responses": {
            "200": json_response(
                {
                    "type": "object",
                    "required": ["tokens"],
                    "properties": {"tokens": {"type": "array", "items": TOKEN}},
                },
                "The tokens",
            ),
            "422": problem("revoked is not true or false"),
        },
    }


def create_token() -> dict:
    """POST ``/tokens``."""
    return {
        "summary": "Create a token; its secret is in this answer only",
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ref("TokenRequest")}},
        },
        "responses": {
            "201": json_response(
                {
                    "allOf": [
                        TOKEN,
                        {
                            "type": "object",
                            "required": ["token"],
                            "properties": {"token": {"type": "string"}},
                        },
                    ]
                },
                "Created; `token` is shown once",
            ),
            "400": problem("Malformed JSON"),
            "409": problem("A live token has that name"),
            "413": problem("Body too large"),
            "415": problem("Not application/json"),
            "422": problem("Invalid fields"),
        },
    }


def revoke_token() -> dict:
    """DELETE ``/tokens/{name}``."""
    return {
        "summary": "Revoke a token by name or id; within a second it stops working",
        "parameters": [
            {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
        ],
        "responses": {
            "200": json_response(TOKEN, "Revoked"),
            "404": problem("No live token of that name or id"),
        },
    }


def audit() -> dict:
    """GET ``/audit``."""
    return {
        "summary": "The audit log: who did what, when, newest first",
        "parameters": [
            {"name": "target", "in": "query", "schema": {"type": "string"}},
        ],
        "responses": {
            "200": json_response(
                {
                    "type": "object",
                    "required": ["entries"],
                    "properties": {"entries": {"type": "array", "items": ref("Audit")}},
                },
                "The latest 200 entries",
            )
        },
    }


def workers() -> dict:
    """GET ``/workers``."""
    return {
        "summary": "Workers seen in the last five minutes",
        "responses": {
            "200": json_response(
                {
                    "type": "object",
                    "required": ["workers"],
                    "properties": {"workers": {"type": "array", "items": ref("Worker")}},
                },
                "The workers",
            )
        },
    }


QUEUE_SCHEMA = {
    "type": "object",
    "required": ["name", "waiting", "running", "oldest_waiting_seconds", "finished_per_second"],
    "properties": {
        "name": {"type": "string"},
        "waiting": {"type": "integer", "description": "queued, or scheduled and due"},
        "waiting_by_priority": {
            "type": "array",
            "items": {"type": "integer"},
            "minItems": 4,
            "maxItems": 4,
            "description": "the waiting jobs of each priority, 0 (the highest) to 3",
        },
        "running": {"type": "integer"},
        "oldest_waiting_seconds": {
            "type": ["number", "null"],
            "description": "how long the oldest waiting job has been due",
        },
        "finished_per_second": {"type": "number", "description": "over the last 5 minutes"},
        "created_at": {"type": "string", "format": "date-time"},
        "paused": {"type": "boolean", "description": "no job of it starts until resumed"},
        "paused_at": {"type": ["string", "null"], "format": "date-time"},
        "paused_by": {"type": ["string", "null"], "description": "the token that paused it"},
        "held": {
            "type": "integer",
            "description": "jobs a worker had fetched when it was paused, held until resumed",
        },
        "concurrency": {
            "type": ["integer", "null"],
            "description": "at most this many of its jobs run at once across all workers",
        },
        "limited": {
            "type": "integer",
            "description": "jobs held by a full concurrency limit (the queue's or their "
            "type's), released as slots free up",
        },
    },
}
_QUEUE_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,47}$"},
}


def _queue_changed(**extra: Any) -> dict:
    """A queue as an operation on it answers: the listed queue, ``changed`` and ``extra``."""
    return {
        "allOf": [
            QUEUE_SCHEMA,
            {
                "type": "object",
                "required": ["changed"],
                "properties": {"changed": {"type": "boolean"}, **extra},
            },
        ]
    }


def _toggle_queue(summary: str, changed: str) -> dict:
    return {
        "summary": summary,
        "parameters": [_QUEUE_NAME],
        "responses": {
            "200": json_response(
                _queue_changed(
                    released={
                        "type": "integer",
                        "description": "held jobs a resume made due again",
                    }
                ),
                changed,
            ),
            "404": problem("No queue of that name (`GET /queues` lists them)"),
        },
    }


def pause_queue() -> dict:
    """POST ``/queues/{name}/pause``."""
    return _toggle_queue(
        "Pause a queue on every worker: no job of it starts once this answers (running ones "
        "finish); its jobs wait, none is lost or spends an attempt",
        "The queue; `changed` is false when it was paused already (not audited)",
    )


def resume_queue() -> dict:
    """POST ``/queues/{name}/resume``."""
    return _toggle_queue(
        "Resume a paused queue: workers fetch it again within a second, and the jobs held "
        "while it was paused are due at once",
        "The queue; `changed` is false when it was not paused (not audited)",
    )


def set_queue_concurrency() -> dict:
    """PUT ``/queues/{name}/concurrency``."""
    return {
        "summary": "Cap how many of a queue's jobs run at once across all workers (null: no "
        "cap); jobs over it wait, spending no attempt, and start as slots free up",
        "parameters": [_QUEUE_NAME],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["concurrency"],
                        "additionalProperties": False,
                        "properties": {"concurrency": {"type": ["integer", "null"], "minimum": 1}},
                    }
                }
            },
        },
        "responses": {
            "200": json_response(
                _queue_changed(),
                "The queue; `changed` is false when it had that cap already (not audited)",
            ),
            "400": problem("Malformed JSON"),
            "404": problem("No queue of that name (`GET /queues` lists them)"),
            "413": problem("Body too large"),
            "415": problem("Not application/json"),
            "422": problem("Invalid fields"),
        },
    }


def list_queues() -> dict:
    """GET ``/queues``."""
    return {
        "summary": "The queues: jobs waiting and running, the oldest waiting, throughput",
        "responses": {
            "200": json_response(
                {
                    "type": "object",
                    "required": ["queues"],
                    "properties": {"queues": {"type": "array", "items": QUEUE_SCHEMA}},
                },
                "Every queue, by name",
            )
        },
    }


def alert_webhook() -> dict:
    """POST ``/alerts/webhook``."""
    return {
        "summary": "Alertmanager's webhook receiver: records each alert it delivers",
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ref("AlertmanagerNotification")}},
        },
        "responses": {
            "200": json_response(
                {
                    "type": "object",
                    "required": ["recorded"],
                    "properties": {"recorded": {"type": "integer", "minimum": 0}},
                },
                "Recorded",
            ),
            "400": problem("Malformed JSON"),
            "413": problem("Body too large"),
            "415": problem("Not application/json"),
            "422": problem("Not an Alertmanager notification"),
        },
    }


_TIME = {"type": "string", "format": "date-time"}
OPERATOR_SCHEMAS: dict[str, Any] = {
    "Token": {
        "type": "object",
        "required": ["id", "name", "prefix", "scopes", "created_at", "created_by"],
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "name": {"type": "string"},
            "prefix": {"type": "string"},
            "scopes": {"type": "array", "items": {"type": "string"}},
            "rate": {"type": ["number", "null"]},
            "burst": {"type": ["integer", "null"]},
            "created_at": _TIME,
            "created_by": {"type": "string"},
            "revoked_at": {"type": ["string", "null"], "format": "date-time"},
            "last_used_at": {"type": ["string", "null"], "format": "date-time"},
        },
    },
    "TokenRequest": {
        "type": "object",
        "required": ["name", "scopes"],
        "additionalProperties": False,
        # a burst needs a rate
        "if": {"required": ["burst"], "properties": {"burst": {"type": "integer"}}},
        "then": {"required": ["rate"], "properties": {"rate": {"type": "number"}}},
        "properties": {
            "name": {"type": "string", "pattern": TOKEN_NAME_PATTERN},
            "scopes": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "string",
                    "enum": list(SCOPES),
                },
            },
            "rate": nullable(
                {
                    "type": "number",
                    "minimum": 0.001,
                    "maximum": 1e6,
                    "description": "requests per second; omitted or null: unlimited",
                }
            ),
            "burst": nullable(
                {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 1_000_000,
                    "description": "bucket size; needs rate (default: rate)",
                }
            ),
        },
    },
    "Audit": {
        "type": "object",
        "required": ["at", "actor", "action"],
        "properties": {
            "at": _TIME,
            "actor": {"type": "string"},
            "action": {"type": "string"},
            "target": {"type": ["string", "null"]},
            "detail": {"type": "object"},
        },
    },
    "Worker": {
        "type": "object",
        "required": ["name", "app", "started_at", "last_seen", "running", "capacity"],
        "properties": {
            "name": {"type": "string"},
            "app": {"type": "string"},
            "started_at": _TIME,
            "last_seen": _TIME,
            "running": {"type": "integer"},
            "capacity": {"type": "integer"},
        },
    },
    "AlertmanagerNotification": {
        "type": "object",
        "required": ["alerts"],
        "properties": {
            "receiver": {"type": "string"},
            "status": {"type": "string"},
            "alerts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["labels"],
                    "properties": {
                        "status": {"type": "string", "enum": ["firing", "resolved"]},
                        "labels": {
                            "type": "object",
                            "required": ["alertname"],
                            "properties": {"alertname": {"type": "string"}},
                            "additionalProperties": {"type": "string"},
                        },
                        "annotations": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        },
                        "startsAt": {"type": "string"},
                        "endsAt": {"type": "string"},
                    },
                },
            },
        },
    },
}
