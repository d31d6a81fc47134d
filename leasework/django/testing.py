"""Test a Django task as a leasework worker runs it, from a Django ``TestCase`` or pytest::

    from leasework.django.testing import run_task

    class ReceiptTests(TestCase):
        def test_the_receipt_is_marked_sent(self):
            order = Order.objects.create(email="a@example.com")
            run = run_task(send_receipt, order.id)
            self.assertTrue(run.succeeded, run.error)
            order.refresh_from_db()
            self.assertIsNotNone(order.receipt_sent_at)

The arguments take the worker's path (a JSON round trip, as ``enqueue`` stores them); the
task runs in the calling thread, on the test's own database connection and inside its
transaction (``close_old_connections`` is not called: it would close a ``TestCase``'s
connection); what it raises is stored as the worker stores it (``run.error``); a
``fenced_atomic`` block in it commits (to the test's savepoint), its fence confirmed as far as
the transaction and the database go (the job has no row). With ``INSTALLED_APPS`` holding
``"leasework.django"``, Django's test database has leasework's tables, so an enqueue inside
the test works as in production once its queue exists there (:func:`make_queues`; a
worker makes it in production).
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from leasework.django.api import Task
from leasework.django.backend import TaskBackend
from leasework.django.mapping import payload_of
from leasework.testing import JobRun, run_job_sync


def run_task(task: Task, *args: Any, **kwargs: Any) -> JobRun:
    """One attempt of ``task`` with ``args`` and ``kwargs``, as a worker runs it."""
    backend = task.get_backend()
    if not isinstance(backend, TaskBackend):
        raise TypeError(
            f"{task.module_path} runs on {type(backend).__name__}, not leasework's "
            "TaskBackend: set TASKS in your settings"
        )
    return run_job_sync(
        backend.app, backend.job_type(task).name, payload_of(args, kwargs), same_thread=True
    )


def make_queues(*names: str, using: str = DEFAULT_DB_ALIAS) -> None:
    """Make leasework queues (their rows: a test database has no Kafka topics to go with
    them, nor needs any) so that an enqueue into them works in a test."""
    with connections[using].cursor() as cursor:
        for name in names:
            cursor.execute(
                "INSERT INTO queues (name, created_by) VALUES (%s, 'leasework.django.testing') "
                "ON CONFLICT (name) DO NOTHING",
                [name],
            )
