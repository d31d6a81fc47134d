"""The worker's side of Django's tasks: the app of every task a leasework backend knows
(``leasework worker --app leasework.django:app``, with ``DJANGO_SETTINGS_MODULE`` set) and
the handlers that run them.

Loading the app sets Django up (``django.setup()``) and imports each installed app's
``tasks`` module, as Celery's autodiscovery does; every ``@task`` of a leasework backend is
then a job type named by its module path. A plain task runs in the thread lane (or the
process lane, when its ``JOB_TYPES`` options say so: each child sets Django up once), an
``async def`` task in the asyncio lane. Around each job the handler calls
``close_old_connections()``, as Django does around a request, so a connection broken or past
``CONN_MAX_AGE`` is not handed to the next job of that thread. A task that raises is stored
with its exception's class path and traceback (:func:`leasework.django.mapping.raised_text`),
which ``get_result`` gives back as Django's ``TaskError``.
"""

from __future__ import annotations

import contextvars
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils.module_loading import autodiscover_modules, import_string

from leasework.context import Cancelled, JobContext
from leasework.django.api import Task, TaskContext, TaskResult, TaskResultStatus
from leasework.django.mapping import arguments_of, raised_text
from leasework.errors import Permanent, Retry, StaleFence

# what a task may raise that leasework judges as it is (not wrapped: not the task's failure,
# or a retry it asked for)
LEASEWORK_ENDINGS = (Retry, StaleFence, Cancelled)


_ATTEMPT: contextvars.ContextVar[JobContext] = contextvars.ContextVar("leasework_attempt")


def current_attempt() -> JobContext:
    """The leasework attempt the running Django task is (its fence, its job id, whether it
    was cancelled). LookupError outside a task run by leasework."""
    try:
        return _ATTEMPT.get()
    except LookupError:
        raise LookupError(
            "no leasework attempt here: current_attempt() works inside a Django task that a "
            "leasework worker (or leasework.django.testing) runs"
        ) from None


@contextmanager
def _attempt(ctx: JobContext) -> Iterator[None]:
    token = _ATTEMPT.set(ctx)
    try:
        yield
    finally:
        _ATTEMPT.reset(token)


class TaskRaised(Exception):
    """What a Django task raised, with its class path and traceback (the stored error)."""


class PermanentTaskRaised(TaskRaised, Permanent):
    """What a Django task raised that retrying cannot help: a ``leasework.Permanent``, or of
    a class its ``JOB_TYPES`` options call permanent."""


def task_of(job_type: str) -> Task:
    """The Django task a job type names (its module path)."""
    try:
        found = import_string(job_type)
    except ImportError as exc:
        raise Permanent(f"{job_type!r} names no importable Django task: {exc}") from exc
    if not isinstance(found, Task):
        raise Permanent(f"{job_type!r} is a {type(found).__name__}, not a Django task")
    return found


def _raised(exc: Exception, permanent: tuple[type[BaseException], ...]) -> TaskRaised:
    cls = type(exc)
    text = raised_text(
        f"{cls.__module__}.{cls.__qualname__}", str(exc), "".join(traceback.format_exception(exc))
    )
    final = isinstance(exc, (Permanent, *permanent))
    return (PermanentTaskRaised if final else TaskRaised)(text)


def _call(ctx: JobContext, payload: Any) -> tuple[Task, list[Any], dict[str, Any]]:
    task = task_of(ctx.type)
    try:
        args, kwargs = arguments_of(payload)
    except ValueError as exc:
        raise Permanent(str(exc)) from None
    if task.takes_context:
        args = [context_of(ctx, task, args, kwargs), *args]
    return task, args, kwargs


def _permanent(task: Task, job_type: str) -> tuple[type[BaseException], ...]:
    backend = task.get_backend()
    found = backend.app.get(job_type) if hasattr(backend, "app") else None
    return found.permanent if found is not None else ()


def context_of(ctx: JobContext, task: Task, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Django's ``TaskContext`` for a task that takes one: its result as this attempt sees
    it (``attempt`` is the attempt's number; ``worker_ids`` repeats this worker for each)."""
    now = datetime.now(UTC)
    result = TaskResult(
        task=task,
        id=str(ctx.job_id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=args,
        kwargs=kwargs,
        backend=task.backend,
        errors=[],
        worker_ids=[ctx.worker] * ctx.attempt,
    )
    return TaskContext(task_result=result)


@contextmanager
def _judged(ctx: JobContext, task: Task) -> Iterator[None]:
    """The task's body runs as ``ctx``'s attempt (:func:`current_attempt`); what it raises is
    stored with its class path and traceback, but leasework's own endings as they are."""
    with _attempt(ctx):
        try:
            yield
        except LEASEWORK_ENDINGS:
            raise
        except Exception as exc:
            raise _raised(exc, _permanent(task, ctx.type)) from exc


def run_task(ctx: JobContext, payload: Any) -> Any:
    """The handler of a plain Django task (thread or process lane)."""
    managed = not ctx.rehearsal  # a test's attempt leaves the test's connection
    if managed:
        close_old_connections()
    try:
        task, args, kwargs = _call(ctx, payload)
        with _judged(ctx, task):
            return task.func(*args, **kwargs)
    finally:
        if managed:
            close_old_connections()


async def run_async_task(ctx: JobContext, payload: Any) -> Any:
    """The handler of an ``async def`` Django task (asyncio lane); Django's async ORM runs
    its queries in asgiref's thread, whose connections are the ones kept fresh here."""
    managed = not ctx.rehearsal
    if managed:
        await sync_to_async(close_old_connections)()
    try:
        task, args, kwargs = _call(ctx, payload)
        with _judged(ctx, task):
            return await task.func(*args, **kwargs)
    finally:
        if managed:
            await sync_to_async(close_old_connections)()


def set_up_django() -> None:
    """Set Django up (once per process) and import every installed app's ``tasks``."""
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()
    autodiscover_modules("tasks")
