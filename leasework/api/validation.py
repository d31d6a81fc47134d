"""The api's request bodies, pure: parsed JSON in, a :class:`~leasework.submission.JobRequest` (or
every field error) out. The checks every door shares are in :mod:`leasework.submission`."""

from __future__ import annotations

from typing import Any

from leasework.app import App
from leasework.errors import FieldError
from leasework.jsonlimits import whole_numbers
from leasework.submission import MAX_BATCH, JobRequest, parse_run_at, request_errors
from leasework.unique import Unique, spec_errors

KNOWN_FIELDS = frozenset(
    {
        "type",
        "payload",
        "run_at",
        "delay_seconds",
        "max_attempts",
        "timeout_seconds",
        "ordering_key",
        "unique",
        "queue",
        "priority",
    }
)
BATCH_ITEM_FIELDS = KNOWN_FIELDS | {"idempotency_key"}


def job_request(
    body: Any, app: App | None, *, idempotency_key: str | None = None, batch_item: bool = False
) -> JobRequest | list[FieldError]:
    """One job of a submit body. In a batch, each item may carry its own ``idempotency_key``;
    a single submit takes it from the ``Idempotency-Key`` header instead."""
    if not isinstance(body, dict):
        return [FieldError("(body)", "must be a JSON object with at least a 'type' field")]
    allowed = BATCH_ITEM_FIELDS if batch_item else KNOWN_FIELDS
    errors = [
        FieldError(unknown, f"unknown field; allowed: {', '.join(sorted(allowed))}")
        for unknown in sorted(set(body) - allowed, key=str)
    ]
    run_at = body.get("run_at")
    if run_at is not None:
        parsed = parse_run_at(run_at)
        if isinstance(parsed, FieldError):
            errors.append(parsed)
            run_at = None
        else:
            run_at = parsed
    if "run_at" in body and "delay_seconds" in body:
        errors.append(FieldError("run_at", "give run_at or delay_seconds, not both"))
    unique = None
    if body.get("unique") is not None:
        problems = spec_errors(body["unique"])
        errors.extend(problems)
        unique = None if problems else Unique.from_spec(body["unique"])
    job_type = body.get("type")
    request = JobRequest(
        type=job_type if isinstance(job_type, str) else "",
        payload=body.get("payload", {}),
        run_at=run_at,
        delay_seconds=None if "run_at" in body else body.get("delay_seconds"),
        max_attempts=whole_numbers(body.get("max_attempts")),
        timeout_seconds=whole_numbers(body.get("timeout_seconds")),
        ordering_key=body.get("ordering_key"),
        idempotency_key=body.get("idempotency_key") if batch_item else idempotency_key,
        unique=unique,
        queue=body.get("queue"),
        priority=whole_numbers(body.get("priority")),
    )
    errors.extend(request_errors(request, app))
    return errors or request


def batch_requests(body: Any, app: App | None) -> list[JobRequest] | list[FieldError]:
    """``{"jobs": [...]}`` with 1 to :data:`MAX_BATCH` items; errors name each bad item by
    index (``jobs[3].payload.order_id``)."""
    if not isinstance(body, dict) or not isinstance(body.get("jobs"), list):
        return [FieldError("jobs", f'send {{"jobs": [...]}} with 1-{MAX_BATCH} job objects')]
    extra = sorted(set(body) - {"jobs"}, key=str)
    if extra:
        return [FieldError(name, "unknown field; allowed: jobs") for name in extra]
    items = body["jobs"]
    if not 1 <= len(items) <= MAX_BATCH:
        return [FieldError("jobs", f"must hold 1-{MAX_BATCH} jobs, got {len(items)}")]
    requests: list[JobRequest] = []
    errors: list[FieldError] = []
    for index, item in enumerate(items):
        parsed = job_request(item, app, batch_item=True)
        if isinstance(parsed, list):
            errors.extend(e.under(f"jobs[{index}]") for e in parsed)
        else:
            requests.append(parsed)
    return errors or requests
