"""The api's route table: every endpoint, its handler, the scope it needs, its OpenAPI
operation and its body cap, in one place (:class:`leasework.api.routing.Route`).

:func:`leasework.api.server.create_app` builds the app from it, the guard finds each request's
scope in it, :func:`leasework.api.openapi.openapi_document` lists its operations (in this
order), and :data:`OPERATION_SCOPES` is read from it, so an endpoint cannot be served without a
scope or go undocumented by accident (``doc=None`` says it on purpose). The console's pages
and actions have a table of the same shape (:data:`leasework.api.console.routes.CONSOLE_ROUTES`)
and take the scope of the operation each is the twin of from here (:func:`scope_of`).
"""

from __future__ import annotations

from leasework.api import (
    jobs,
    openapi_jobs,
    openapi_operators,
    openapi_ops,
    openapi_schedules,
    operators,
    ops,
    queues,
    schedules,
    submit,
)
from leasework.api.limits import BodyKind
from leasework.api.routing import Route

ROUTES: tuple[Route, ...] = (
    # the jobs (leasework/api/submit.py, leasework/api/jobs.py)
    Route("POST", "/jobs", submit.submit, "submit", "submit", openapi_jobs.submit_job,
          body=BodyKind.SUBMIT, fast=True),
    Route("GET", "/jobs", jobs.list_jobs, "read", "list_jobs", openapi_jobs.list_jobs),
    Route("POST", "/jobs/batch", submit.submit_batch, "submit", "submit_batch",
          openapi_jobs.submit_batch, body=BodyKind.BATCH),
    Route("POST", "/jobs/retry", jobs.retry_matching, "cancel", "retry_matching",
          openapi_jobs.retry_matching),
    Route("GET", "/jobs/{job_id}", jobs.get_job, "read", "get_job", openapi_jobs.get_job),
    Route("POST", "/jobs/{job_id}/cancel", jobs.cancel, "cancel", "cancel",
          openapi_jobs.cancel_job),
    Route("POST", "/jobs/{job_id}/retry", jobs.retry, "cancel", "retry", openapi_jobs.retry_job),
    Route("GET", "/job-types", jobs.job_types, "read", "job_types", openapi_jobs.job_types),
    Route("GET", "/queues", queues.list_queues, "read", "list_queues",
          openapi_operators.list_queues),
    Route("POST", "/queues/{name}/pause", queues.pause_queue, "cancel", "pause_queue",
          openapi_operators.pause_queue),
    Route("POST", "/queues/{name}/resume", queues.resume_queue, "cancel", "resume_queue",
          openapi_operators.resume_queue),
    Route("PUT", "/queues/{name}/concurrency", queues.set_queue_concurrency, "cancel",
          "set_queue_concurrency", openapi_operators.set_queue_concurrency),
    # recurring schedules (leasework/api/schedules.py): reading them needs read; changing
    # them needs cancel, the scope of the operators' other changes (cancel, retry)
    Route("GET", "/schedules", schedules.list_schedules, "read", "list_schedules",
          openapi_schedules.list_schedules),
    Route("POST", "/schedules", schedules.create_schedule, "cancel", "create_schedule",
          openapi_schedules.create_schedule),
    Route("GET", "/schedules/{name}", schedules.get_schedule, "read", "get_schedule",
          openapi_schedules.get_schedule),
    Route("DELETE", "/schedules/{name}", schedules.delete_schedule, "cancel", "delete_schedule",
          openapi_schedules.delete_schedule),
    Route("POST", "/schedules/{name}/pause", schedules.pause_schedule, "cancel",
          "pause_schedule", openapi_schedules.pause_schedule),
    Route("POST", "/schedules/{name}/resume", schedules.resume_schedule, "cancel",
          "resume_schedule", openapi_schedules.resume_schedule),
    Route("POST", "/schedules/{name}/trigger", schedules.trigger_schedule, "cancel",
          "trigger_schedule", openapi_schedules.trigger_schedule),
    Route("POST", "/schedules/{name}/backfill", schedules.backfill_schedule, "cancel",
          "backfill_schedule", openapi_schedules.backfill_schedule),
    # what every process serves (leasework/api/ops.py)
    Route("GET", "/healthz", ops.healthz, None, "healthz", openapi_ops.healthz),
    Route("GET", "/readyz", ops.readyz, None, "readyz", openapi_ops.readyz),
    Route("GET", "/metrics", ops.metrics, None, "metrics", openapi_ops.metrics),
    Route("GET", "/openapi.json", ops.openapi, None, "openapi"),  # the document itself
    # the operators' (leasework/api/operators.py)
    Route("GET", "/tokens", operators.list_tokens, "admin", "list_tokens",
          openapi_operators.list_tokens),
    Route("POST", "/tokens", operators.create_token, "admin", "create_token",
          openapi_operators.create_token),
    Route("DELETE", "/tokens/{name}", operators.revoke_token, "admin", "revoke_token",
          openapi_operators.revoke_token),
    Route("GET", "/audit", operators.audit, "admin", "audit", openapi_operators.audit),
    Route("GET", "/workers", operators.workers, "read", "workers", openapi_operators.workers),
    Route("POST", "/alerts/webhook", operators.alert_webhook, "alerts", "alert_webhook",
          openapi_operators.alert_webhook, body=BodyKind.WEBHOOK),
)  # fmt: skip

# (path template, method in lower case) -> the scope the operation needs; None: public
OPERATION_SCOPES: dict[tuple[str, str], str | None] = {route.key: route.scope for route in ROUTES}


def scope_of(method: str, path: str) -> str | None:
    """The scope of the api's operation ``method path``; KeyError when there is none (a
    console page cannot name a twin that does not exist)."""
    return OPERATION_SCOPES[(path, method.lower())]
