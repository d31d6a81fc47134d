"""leasework for Django: a ``django.tasks`` backend whose enqueue is part of your
``transaction.atomic()`` block, the fence confirmed in Django's own transaction, and the
worker's app of your tasks.

::

    # settings.py
    TASKS = {"default": {"BACKEND": "leasework.django.TaskBackend"}}

    # orders/tasks.py
    from django.tasks import task          # Django 6; the backport: from django_tasks import task

    @task
    def send_receipt(order_id: int) -> None: ...

    # orders/views.py
    with transaction.atomic():
        order = Order.objects.create(...)
        result = send_receipt.enqueue(order.id)   # one commit: the order and its job, or neither

    # the worker
    DJANGO_SETTINGS_MODULE=mysite.settings leasework worker --app leasework.django:app

The enqueue runs on Django's own connection (``OPTIONS["DATABASE"]``, default ``default``),
which must reach leasework's database; ``result.id`` is the job id. How Django's priorities,
queues, ``run_after`` and states map onto leasework's: :mod:`leasework.django.mapping`.
``OPTIONS["JOB_TYPES"]`` gives a task leasework's policy by module path (``max_attempts``,
``timeout``, ``backoff``, ``permanent``, ``runs_in``: ``"process"`` for CPU-bound code), and
``OPTIONS["DEFAULTS"]`` every task's. Signals: ``task_enqueued`` is sent at the enqueue;
``task_started`` and ``task_finished`` are not sent (the worker runs no Django signal
machinery of its own: use leasework's metrics).
"""

from __future__ import annotations

from typing import Any

from leasework.django.backend import TaskBackend, fenced_atomic
from leasework.django.worker import current_attempt


def __getattr__(name: str) -> Any:
    if name == "app":  # leasework worker --app leasework.django:app
        from leasework.django.backend import worker_app

        return worker_app()
    raise AttributeError(f"module 'leasework.django' has no attribute {name!r}")


__all__ = ["TaskBackend", "current_attempt", "fenced_atomic"]
