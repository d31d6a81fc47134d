"""How Django's task vocabulary maps onto leasework's (pure functions).

=====================  ==========================================================
Django                 leasework
=====================  ==========================================================
task's module path     job type (``orders.tasks.send_receipt``)
``args``, ``kwargs``   payload ``{"args": [...], "kwargs": {...}}`` (JSON)
``queue_name``         queue (it must exist: ``leasework queues create NAME``)
``priority``           priority band: 0 to 100 -> 0 (the highest, leasework's
                       default), -1 to -33 -> 1, -34 to -66 -> 2, -67 to -100 -> 3
``run_after``          ``run_at`` (a naive datetime is taken in Django's time zone)
result id              job id (its text)
``READY``              ``scheduled``, ``queued``, and ``failed`` (waiting for its retry)
``RUNNING``            ``running``
``SUCCESSFUL``         ``succeeded``
``FAILED``             ``dead``, and ``cancelled`` (Django has no state of its own for it)
``errors``             the error of each failed attempt, oldest first
``worker_ids``         the worker of each attempt, oldest first
=====================  ==========================================================

Django's priorities above 0 all land in leasework's highest band with the default ones:
leasework has four bands and Django's default is its top one.
"""

from __future__ import annotations

from typing import Any

ARGS, KWARGS = "args", "kwargs"
# how the worker stores the error of a task that raised (describe(): class name, then text)
RAISED = "TaskRaised: "
RAISED_PERMANENT = "PermanentTaskRaised: "
NOT_RAISED_CLASS = "leasework.errors.JobFailed"  # an attempt that ended without raising

DJANGO_STATUS = {
    "scheduled": "READY",
    "queued": "READY",
    "failed": "READY",
    "running": "RUNNING",
    "succeeded": "SUCCESSFUL",
    "dead": "FAILED",
    "cancelled": "FAILED",
}


def leasework_priority(priority: int) -> int:
    """Django's priority (-100 to 100, higher first; default 0) as leasework's band (0, the
    highest and the default, to 3)."""
    if priority >= 0:
        return 0
    return min(3, 1 + (-priority - 1) // 33)


def payload_of(args: Any, kwargs: Any) -> dict[str, Any]:
    return {ARGS: list(args), KWARGS: dict(kwargs)}


def arguments_of(payload: Any) -> tuple[list[Any], dict[str, Any]]:
    """The task's arguments from the payload :func:`payload_of` made (ValueError if it is
    not one)."""
    if not isinstance(payload, dict) or not isinstance(payload.get(ARGS, []), list):
        raise ValueError("a Django task's payload is {'args': [...], 'kwargs': {...}}")
    kwargs = payload.get(KWARGS, {})
    if not isinstance(kwargs, dict):
        raise ValueError("a Django task's kwargs are an object")
    return list(payload.get(ARGS, [])), dict(kwargs)


def raised_text(class_path: str, message: str, traceback: str) -> str:
    """What the worker stores for a task that raised (after ``RAISED``)."""
    return f"{class_path}: {message}\n\n{traceback}"


def error_parts(stored: str) -> tuple[str, str]:
    """(exception class path, traceback) of an attempt's stored error: what the task raised,
    or, for an attempt that ended otherwise (a timeout, a lost lease, a stop), leasework's
    ``JobFailed`` and the error's text."""
    prefix = next((p for p in (RAISED, RAISED_PERMANENT) if stored.startswith(p)), None)
    if prefix is None:
        return NOT_RAISED_CLASS, stored
    text = stored[len(prefix) :]
    head, _, traceback = text.partition("\n\n")
    class_path = head.split(": ", 1)[0]
    return class_path, traceback or text
