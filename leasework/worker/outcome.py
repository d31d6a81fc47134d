"""What an attempt came to, decided from what happened to its handler: pure functions of the
job, the handler's result and why its scopes were cancelled, if they were.

A cancel request is ``cancelled``; success is ``succeeded`` with the handler's result; every
other ending (an error, a timeout, a lost lease, a service refusing the attempt's fence, a
shutdown) retries with the job's own backoff (the settings' when the job has none), or after
the delay the handler asked for (``leasework.Retry(after=...)``), or is ``dead`` when
permanent or on the last attempt. A shutdown retries at once: the worker cut the attempt
short, not the job.
"""

from __future__ import annotations

from leasework.job import Job
from leasework.outcomes import Outcome, RetryDefaults, retry_outcome
from leasework.states import Status
from leasework.worker.execution import HandlerResult, describe
from leasework.worker.heartbeat import CancelReason


def outcome_of(
    job: Job,
    handled: HandlerResult | None,
    defaults: RetryDefaults,
    *,
    timed_out: bool,
    cancelled_by: CancelReason | None,
) -> Outcome:
    """The attempt's outcome: ``handled`` is None when a scope cut the handler short."""
    if cancelled_by == CancelReason.REQUEST:
        return Outcome(Status.CANCELLED, "cancelled on request while running")
    permanent = False
    if cancelled_by == CancelReason.LEASE:
        error = "lease lost: handler cancelled at its lease deadline"
    elif cancelled_by == CancelReason.SHUTDOWN:
        error = "worker shut down before the handler finished"
    elif timed_out or handled is None:
        error = f"timed out after {job.timeout_seconds}s"
    elif handled.stale:
        # written only if this attempt still holds the job (the completer's fenced write):
        # then the service's fence was ahead of Postgres's, and a retry is what is left
        error = f"lease lost: a service refused the attempt's fence ({handled.error})"
    elif handled.ok:
        return Outcome(Status.SUCCEEDED, result=handled.result)
    else:
        error, permanent = handled.error, handled.permanent
    return retry_outcome(
        job,
        error,
        defaults,
        permanent=permanent,
        immediate=cancelled_by == CancelReason.SHUTDOWN,
        after=handled.retry_after
        if handled is not None and handled.retry_after is not None
        else None,
    )


def effect_failure(
    job: Job, exc: Exception, defaults: RetryDefaults, *, permanent: bool
) -> Outcome:
    """The outcome of a succeeded attempt one of whose fenced effects raised ``exc``."""
    return retry_outcome(
        job, f"a fenced effect raised {describe(exc)}", defaults, permanent=permanent
    )
