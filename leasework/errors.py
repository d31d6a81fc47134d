"""Every exception leasework raises to its users, in one place.

One base class, :class:`LeaseworkError`, whose docstring is the default message; narrow
subclasses for what a caller may want to catch. :class:`Permanent` is different: it is what a
*handler* raises to say "retrying cannot help", so it derives from ``Exception`` only.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any


@dataclass(frozen=True)
class FieldError:
    """One thing wrong with one field of a job request; ``field`` is a dotted path such as
    ``payload.items[2].sku`` or ``jobs[3].type``."""

    field: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}

    def under(self, prefix: str) -> FieldError:
        """The same error, for the request at ``prefix`` (``jobs[3]``) of a batch."""
        return FieldError(f"{prefix}.{self.field}", self.message)


class LeaseworkError(Exception):
    """Something went wrong in leasework."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class Permanent(Exception):
    """Raised by a handler when retrying cannot help: the job goes to ``dead`` at once."""


MAX_RETRY_AFTER = 30 * 86400.0  # seconds: a handler's own retry waits a month at most


class Retry(Exception):
    """Raised by a handler to be tried again ``after`` seconds (or a ``timedelta``) from now,
    in place of its type's backoff, like Celery's ``self.retry(countdown=...)``: the attempt
    counts (on its last one the job goes to ``dead``), and ``reason`` is its error."""

    def __init__(self, after: float | timedelta = 0.0, reason: str = "") -> None:
        seconds = after.total_seconds() if isinstance(after, timedelta) else after
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds <= MAX_RETRY_AFTER
        ):
            raise ValueError(
                f"Retry(after=) is 0 to {MAX_RETRY_AFTER:g} seconds or a timedelta, got {after!r}"
            )
        super().__init__(float(seconds), reason)
        self.after = float(seconds)
        self.reason = reason

    def __str__(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        return f"the handler asked to be retried in {self.after:g}s{why}"


class StaleFence(LeaseworkError):
    """A service refused this attempt's call: it has seen a higher fence for the job, so a
    newer attempt holds it. Raised by :func:`leasework.downstream.verify` in the service, and
    by :func:`leasework.downstream.raise_if_stale` in the job on the service's answer; the
    worker ends the attempt as a stale one, not as an error of the handler."""

    def __init__(
        self,
        job_id: uuid.UUID | None,
        fence: int | None,
        highest: int | None,
        *,
        detail: str = "",
    ) -> None:
        self.job_id, self.fence, self.highest = job_id, fence, highest
        seen = f"; it has seen fence {highest}" if highest is not None else ""
        super().__init__(
            detail
            or f"stale fence: job {job_id}'s call with fence {fence} was refused{seen} (a "
            "newer attempt holds the job)"
        )


class FenceUnavailable(LeaseworkError, Permanent):
    """The fence cannot be confirmed on this connection (outside a transaction, or in a
    database without leasework's tables): a mistake in the handler, so the job goes to
    ``dead`` at once rather than being retried into the same refusal."""


class AppError(LeaseworkError):
    """The application's job definitions are not valid."""


class AppLoadError(AppError):
    """The application named by --app or LEASEWORK_APP cannot be imported."""


class InvalidJob(LeaseworkError, ValueError):
    """The job request is not valid; nothing was written."""

    def __init__(self, errors: list[FieldError], message: str | None = None) -> None:
        self.errors = errors
        listed = "; ".join(f"{e.field}: {e.message}" for e in errors[:10])
        more = f" (and {len(errors) - 10} more)" if len(errors) > 10 else ""
        super().__init__(message or f"invalid job request, nothing was written: {listed}{more}")


class UnknownJobType(InvalidJob):
    """The job type is not one the application defines."""


class IdempotencyConflict(LeaseworkError):
    """The idempotency key was used before for a different request; nothing was written."""

    def __init__(self, key: str, job_id: uuid.UUID) -> None:
        self.key = key
        self.job_id = job_id
        super().__init__(
            f"idempotency key {key!r} was used for a different request (job {job_id}); use a "
            "new key for a new job, or send the original request again to get that job"
        )


class JobFailed(LeaseworkError):
    """The job ended without succeeding."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.status = job.get("status")
        self.last_error = job.get("last_error")
        super().__init__(
            f"job {job.get('id')} ({job.get('type')}) ended {self.status} after "
            f"{job.get('attempt')} attempt(s): {self.last_error or 'no error recorded'}"
        )


class WaitTimeout(LeaseworkError, TimeoutError):
    """The job did not finish within the time the caller was willing to wait."""

    def __init__(self, job: dict[str, Any], timeout: float) -> None:
        self.job = job
        super().__init__(
            f"job {job.get('id')} is still {job.get('status')} after {timeout:g}s; it goes on "
            "running: wait again, or look it up with GET /jobs/{id}"
        )
