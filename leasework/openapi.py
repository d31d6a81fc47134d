"""The OpenAPI 3.1 description served at ``/openapi.json``."""

from __future__ import annotations

from leasework.states import Status

_PROBLEM = {"$ref": "#/components/schemas/Problem"}


def _problem(description: str) -> dict:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": _PROBLEM}},
    }


_JOB_REF = {"$ref": "#/components/schemas/Job"}
_JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}

OPENAPI: dict = {
    "openapi": "3.1.0",
    "info": {
        "title": "leasework",
        "version": "0.1.0",
        "description": "Submit jobs; workers run them under a fenced lease.",
    },
    "paths": {
        "/jobs": {
            "post": {
                "summary": "Submit a job",
                "parameters": [
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string", "minLength": 1, "maxLength": 200},
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Submit"}}
                    },
                },
                "responses": {
                    "202": {
                        "description": "Accepted (or replayed under the same Idempotency-Key)",
                        "content": {"application/json": {"schema": _JOB_REF}},
                    },
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
                    {"name": "type", "in": "query", "schema": {"type": "string"}},
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 200},
                    },
                    {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": {
                        "description": "A page of jobs",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "jobs": {"type": "array", "items": _JOB_REF},
                                        "next_cursor": {"type": ["string", "null"]},
                                    },
                                }
                            }
                        },
                    },
                    "400": _problem("Bad cursor"),
                    "422": _problem("Invalid filter"),
                },
            },
        },
        "/jobs/{job_id}": {
            "get": {
                "summary": "Get a job",
                "parameters": [_JOB_ID],
                "responses": {
                    "200": {
                        "description": "The job",
                        "content": {"application/json": {"schema": _JOB_REF}},
                    },
                    "404": _problem("No such job"),
                },
            }
        },
        "/jobs/{job_id}/cancel": {
            "post": {
                "summary": "Cancel a job",
                "parameters": [_JOB_ID],
                "responses": {
                    "200": {
                        "description": "Cancelled (it was waiting)",
                        "content": {"application/json": {"schema": _JOB_REF}},
                    },
                    "202": {
                        "description": "Cancel requested from the running worker",
                        "content": {"application/json": {"schema": _JOB_REF}},
                    },
                    "404": _problem("No such job"),
                    "409": _problem("Already finished"),
                },
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
    },
    "components": {
        "schemas": {
            "Submit": {
                "type": "object",
                "required": ["type"],
                "additionalProperties": False,
                "properties": {
                    "type": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,100}$"},
                    "payload": {},
                    "run_at": {"type": "string", "format": "date-time"},
                    "delay_seconds": {"type": "number", "minimum": 0},
                    "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100},
                    "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 86400},
                    "ordering_key": {"type": "string", "minLength": 1, "maxLength": 200},
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
                    "ordering_key": {"type": ["string", "null"]},
                    "last_error": {"type": ["string", "null"]},
                    "cancel_requested": {"type": "boolean"},
                    "run_at": {"type": "string"},
                    "created_at": {"type": "string"},
                    "updated_at": {"type": "string"},
                    "started_at": {"type": ["string", "null"]},
                    "finished_at": {"type": ["string", "null"]},
                    "replay": {"type": "boolean"},
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
    },
}
