"""Which scope each door needs: one table for the API's operations and the console's pages.

A console page or action that shows or changes the same data as an API operation is that
operation's twin (:data:`CONSOLE_TWINS`) and needs the same scope, read from
:data:`OPERATION_SCOPES`, so the two doors cannot drift apart: the audit log is ``admin`` in
both. Console endpoints with no API twin name their scope in :data:`CONSOLE_OWN`.
"""

from __future__ import annotations

# (path template, method) -> the scope the operation needs; None: public
OPERATION_SCOPES: dict[tuple[str, str], str | None] = {
    ("/jobs", "post"): "submit",
    ("/jobs/batch", "post"): "submit",
    ("/jobs", "get"): "read",
    ("/jobs/{job_id}", "get"): "read",
    ("/job-types", "get"): "read",
    ("/workers", "get"): "read",
    ("/jobs/{job_id}/cancel", "post"): "cancel",
    ("/jobs/{job_id}/retry", "post"): "cancel",
    ("/jobs/retry", "post"): "cancel",
    ("/tokens", "get"): "admin",
    ("/tokens", "post"): "admin",
    ("/tokens/{name}", "delete"): "admin",
    ("/audit", "get"): "admin",
    ("/alerts/webhook", "post"): "alerts",
    ("/openapi.json", "get"): None,
    ("/healthz", "get"): None,
    ("/readyz", "get"): None,
    ("/metrics", "get"): None,
}

# console endpoint -> the API operation that shows or changes the same data
CONSOLE_TWINS: dict[str, tuple[str, str]] = {
    "jobs": ("/jobs", "get"),
    "job": ("/jobs/{job_id}", "get"),
    "workers": ("/workers", "get"),
    "audit": ("/audit", "get"),
    "cancel": ("/jobs/{job_id}/cancel", "post"),
    "retry": ("/jobs/{job_id}/retry", "post"),
    "retry_many": ("/jobs/retry", "post"),
}

# console endpoints with no API twin -> their scope (None: no session needed)
CONSOLE_OWN: dict[str, str | None] = {
    "login": None,
    "static": None,
    "overview": "read",  # counts by type and status, workers, the latest notifications
    "alerts": "read",  # Alertmanager's notifications (the overview shows the latest too)
    "logout": "read",
    "not_found": "read",
}

# what a job's page shows of the audit log (its operator actions) needs the audit's scope
JOB_AUDIT_SCOPE = OPERATION_SCOPES[("/audit", "get")]


def console_scope(endpoint: str) -> str | None:
    """The scope a console endpoint (``jobs``, ``audit``, …) needs; KeyError for one the
    table does not know, so a new page cannot be served without an entry."""
    if endpoint in CONSOLE_TWINS:
        return OPERATION_SCOPES[CONSOLE_TWINS[endpoint]]
    return CONSOLE_OWN[endpoint]
