"""The OpenAPI operations of the job endpoints (:mod:`leasework.api.submit`,
:mod:`leasework.api.jobs`), one function each, named beside its handler in the route table
(:data:`leasework.api.routes.ROUTES`). The guard's answers (401, 403, 408, 413, 429) and the
scope are added to every operation by :func:`leasework.api.openapi.secured`."""

from __future__ import annotations

from leasework.api.jobs import MAX_LIST_LIMIT
from leasework.api.openapi_parts import (
    IDEMPOTENCY_KEY,
    JOB_ID,
    NULLABLE_STRING,
    TYPE_NAME,
    json_response,
    problem,
    ref,
)
from leasework.app import JobType
from leasework.states import Status
from leasework.submission import MAX_BATCH
from leasework.unique import MAX_PERIOD_SECONDS, STATE_BITS, UNFINISHED

UNIQUE_DESCRIPTION = (
    "Ask for uniqueness: at most one job of this type with the same values of `fields` "
    "(top-level payload fields, each required in the payload; [] for the type alone) among "
    "the jobs in `states` (default: the unfinished ones, which it must include) and, with "
    "`period_seconds`, whose run_at falls in the same period (buckets from the Unix epoch, "
    "UTC). A submit whose key a job holds writes nothing and is answered 200 with that job and "
    "`duplicate: true`. Left out: the type's declared uniqueness, if any."
)


def unique_schema(job_type: JobType) -> dict:
    """The ``unique`` field of a submit of ``job_type``. Its ``fields`` lists the payload
    fields every valid payload of the type has (the model's required ones): the api takes any
    top-level field the payload has, which a schema cannot say of an untyped payload."""
    schema = job_type.payload_schema()
    required = schema.get("required") if isinstance(schema.get("properties"), dict) else None
    names = sorted(required) if isinstance(required, list) else []
    fields: dict = {"type": "array", "uniqueItems": True, "maxItems": len(names)}
    if names:
        fields["items"] = {"type": "string", "enum": names}
    states = [s.value for s in STATE_BITS]
    return {
        "type": "object",
        "required": ["fields"],
        "additionalProperties": False,
        "description": UNIQUE_DESCRIPTION,
        "properties": {
            "fields": fields,
            "period_seconds": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": MAX_PERIOD_SECONDS,
            },
            "states": {
                "type": ["array", "null"],
                "uniqueItems": True,
                "items": {"type": "string", "enum": states},
                "allOf": [{"contains": {"const": s}} for s in states if s in UNFINISHED],
            },
        },
    }


def submit_job() -> dict:
    """POST ``/jobs``."""
    return {
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
            "content": {"application/json": {"schema": ref("Submit")}},
        },
        "responses": {
            "202": json_response(ref("Accepted"), "Accepted (or replayed under the same key)"),
            "200": {
                **json_response(
                    ref("Accepted"),
                    "A duplicate: the job that holds the unique key (`duplicate: true`); "
                    "nothing was written",
                ),
                "headers": {
                    "Location": {
                        "description": "the job that holds the key",
                        "schema": {"type": "string"},
                    }
                },
            },
            "400": problem("Malformed JSON"),
            "409": problem("Idempotency-Key reused with a different body"),
            "413": problem("Body too large"),
            "415": problem("Not application/json"),
            "422": problem("Invalid fields; `errors` names each"),
            "503": problem("Database unavailable; retry with the same key"),
        },
    }


def list_jobs() -> dict:
    """GET ``/jobs``."""
    return {
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
                "schema": TYPE_NAME,
            },
            {
                "name": "limit",
                "in": "query",
                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT},
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
            "200": json_response(
                {
                    "type": "object",
                    "properties": {
                        "jobs": {"type": "array", "items": ref("Job")},
                        "next_cursor": NULLABLE_STRING,
                    },
                },
                "A page of jobs",
            ),
            "400": problem("Bad cursor"),
            "422": problem("Invalid filter"),
        },
    }


def submit_batch() -> dict:
    """POST ``/jobs/batch``."""
    return {
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
                                "items": ref("BatchItem"),
                            }
                        },
                    }
                }
            },
        },
        "responses": {
            "202": json_response(
                {
                    "type": "object",
                    "properties": {"jobs": {"type": "array", "items": ref("Accepted")}},
                },
                "Every job accepted, in request order; an item whose unique key a job holds "
                "is that job with `duplicate: true` (nothing written for it, the rest are)",
            ),
            "400": problem("Malformed JSON"),
            "409": problem("An item's idempotency key was used for another request"),
            "413": problem("Body too large"),
            "415": problem("Not application/json"),
            "422": problem("Invalid items; `errors` names each by index"),
            "503": problem("Database unavailable; nothing was written"),
        },
    }


def retry_matching() -> dict:
    """POST ``/jobs/retry``."""
    return {
        "summary": "Retry dead or cancelled jobs matching a filter",
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ref("RetryFilter")}},
        },
        "responses": {
            "200": json_response(
                {"type": "object", "properties": {"retried": {"type": "integer"}}},
                "How many jobs were put back in the queue",
            ),
            "400": problem("Malformed JSON"),
            "415": problem("Not application/json"),
            "422": problem("Invalid filter"),
        },
    }


def get_job() -> dict:
    """GET ``/jobs/{job_id}``."""
    return {
        "summary": "Get a job",
        "parameters": [JOB_ID],
        "responses": {
            "200": json_response(ref("Job"), "The job"),
            "404": problem("No such job"),
        },
    }


def cancel_job() -> dict:
    """POST ``/jobs/{job_id}/cancel``."""
    return {
        "summary": "Cancel a job",
        "parameters": [JOB_ID],
        "responses": {
            "200": json_response(ref("Job"), "Cancelled (it was waiting)"),
            "202": json_response(ref("Job"), "Cancel requested from the running worker"),
            "404": problem("No such job"),
            "409": problem("Already finished"),
        },
    }


def retry_job() -> dict:
    """POST ``/jobs/{job_id}/retry``."""
    return {
        "summary": "Retry a dead or cancelled job with a fresh attempt budget",
        "parameters": [JOB_ID],
        "responses": {
            "200": json_response(ref("Job"), "Queued again"),
            "404": problem("No such job"),
            "409": problem("Not dead or cancelled, or another job holds its unique key"),
        },
    }


def job_types() -> dict:
    """GET ``/job-types``."""
    return {
        "summary": "The job types of the loaded app, with payload schemas and policy",
        "responses": {"200": {"description": "the types"}},
    }
