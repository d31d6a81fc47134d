"""The ``django.tasks`` backend (:class:`TaskBackend`), the fence in Django's transaction
(:func:`fenced_atomic`) and the worker's app of every task a leasework backend knows
(:func:`worker_app`); :mod:`leasework.django` says how they are used."""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from leasework.app import App, JobType
from leasework.context import JobContext
from leasework.django.api import (
    BaseTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from leasework.django.mapping import (
    DJANGO_STATUS,
    arguments_of,
    error_parts,
    leasework_priority,
    payload_of,
)
from leasework.django.worker import (
    current_attempt,
    run_async_task,
    run_task,
    set_up_django,
    task_of,
)
from leasework.enqueue import enqueue
from leasework.errors import AppLoadError
from leasework.states import TERMINAL, Status

RESULT_SQL = """SELECT j.type, j.payload::text AS payload, j.status, j.result::text AS result,
       j.created_at, j.started_at,
       j.finished_at, a.workers, a.errors, a.last_started
  FROM jobs j
  LEFT JOIN LATERAL (
       SELECT array_agg(worker ORDER BY attempt) AS workers,
              array_agg(error ORDER BY attempt) FILTER (WHERE error IS NOT NULL) AS errors,
              max(started_at) AS last_started
         FROM attempts WHERE job_id = j.id) a ON true
 WHERE j.id = %s"""


class TaskBackend(BaseTaskBackend):
    """A ``django.tasks`` backend that enqueues into leasework in Django's transaction."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        self.database: str = self.options.get("DATABASE", DEFAULT_DB_ALIAS)
        self.defaults: dict[str, Any] = dict(self.options.get("DEFAULTS", {}))
        self.policies: dict[str, dict[str, Any]] = dict(self.options.get("JOB_TYPES", {}))
        self.app = App(f"django:{alias}")  # a job type per task validated (declared) here

    def validate_task(self, task: Task) -> None:
        """Django's checks, then the task's job type (its policy refused now, at import,
        rather than at its first enqueue)."""
        super().validate_task(task)
        self.job_type(task)

    def job_type(self, task: Task) -> JobType:
        """The job type of ``task``: its module path, its lane, its policy."""
        name = task.module_path
        if (found := self.app.get(name)) is not None:
            return found
        policy = {**self.defaults, **self.policies.get(name, {})}
        is_async = inspect.iscoroutinefunction(task.func)
        job_type = JobType(
            name,
            run_async_task if is_async else run_task,
            runs_in=policy.pop("runs_in", "asyncio" if is_async else None),
            **policy,
        )
        self.app.add(job_type)
        return job_type

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Insert the task's job in Django's open transaction (its own, outside
        ``atomic()``) and return its result, ``READY``, whose id is the job's."""
        self.validate_task(task)
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):
            run_after = timezone.make_aware(run_after)
        job_id = enqueue(
            connections[self.database],
            task.module_path,
            payload_of(args, kwargs),
            app=self.app,
            queue=task.queue_name,
            priority=leasework_priority(task.priority),
            run_at=run_after,
        )
        result = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=datetime.now(UTC),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as its job stands (one query on Django's connection)."""
        try:
            job_id = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        with connections[self.database].cursor() as cursor:
            cursor.execute(RESULT_SQL, [str(job_id)])
            row = cursor.fetchone()
            if row is None:
                raise TaskResultDoesNotExist(result_id)
            names = [column[0] for column in cursor.description]
        job = dict(zip(names, row, strict=True))

        task = task_of(job["type"])
        args, kwargs = arguments_of(_json(job["payload"]))
        result = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus(DJANGO_STATUS[job["status"]]),
            enqueued_at=job["created_at"],
            started_at=job["started_at"],
            finished_at=job["finished_at"] if Status(job["status"]) in TERMINAL else None,
            last_attempted_at=job["last_started"],
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[
                TaskError(exception_class_path=path, traceback=text)
                for path, text in map(error_parts, job["errors"] or [])
            ],
            worker_ids=list(job["workers"] or []),
        )
        if job["status"] == "succeeded":
            object.__setattr__(result, "_return_value", _json(job["result"]))
        return result


def _json(text: str | None) -> Any:
    """A jsonb value read as its text (whatever Django makes its driver decode jsonb as)."""
    return None if text is None else json.loads(text)


@contextmanager
def fenced_atomic(
    ctx: JobContext | None = None, using: str | None = None, *, durable: bool = True
) -> Iterator[None]:
    """``transaction.atomic()`` whose commit happens only while the attempt (``ctx``, by
    default the running task's: :func:`current_attempt`) holds its fence: at the block's
    end, as its last statement, :meth:`JobContext.confirm_fence` locks the job's row until
    the commit and raises :class:`~leasework.StaleFence` (the block rolls back, its writes
    with it) when a newer attempt, or the reaper, has taken the job. ``durable`` (the
    default) refuses to nest it in another ``atomic()``, whose commit would come later than
    the confirmation."""

    attempt = ctx if ctx is not None else current_attempt()
    alias = using or DEFAULT_DB_ALIAS
    with transaction.atomic(using=alias, durable=durable):
        yield
        attempt.confirm_fence(connections[alias])


def worker_app() -> App:
    """The app of every task of every leasework backend in ``settings.TASKS``."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    from leasework.django.api import task_backends

    try:
        set_up_django()
    except ImproperlyConfigured as exc:
        raise AppLoadError(
            f"leasework.django:app cannot set Django up ({exc}); set DJANGO_SETTINGS_MODULE "
            "to your project's settings, as for manage.py"
        ) from exc
    merged = App("django")
    for alias in getattr(settings, "TASKS", {}) or {}:
        backend = task_backends[alias]
        if isinstance(backend, TaskBackend):
            for job_type in backend.app:
                if job_type.name not in merged:
                    merged.add(job_type)
    if not len(merged):
        raise AppLoadError(
            "leasework.django:app found no task of a leasework backend: set TASKS = "
            '{"default": {"BACKEND": "leasework.django.TaskBackend"}} in your settings and '
            "define tasks with @task in an installed app's tasks.py"
        )
    if any(job_type.lane == "process" for job_type in merged):
        merged.on_lane_start("process")(set_up_django)  # each child, once
    return merged
