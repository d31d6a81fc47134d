"""The examples a user copies, run end to end against the real stack by one worker of both
(``leasework worker --app leasework.django:app,examples.fastapi_shop.jobs:app`` serving the
queues ``django-shop`` and ``fastapi-shop``, which it makes):

- ``examples.django_shop``, a Django project on the ``django.tasks`` backend: a view saves an
  order and enqueues its task in one ``transaction.atomic()`` (an error after the enqueue
  takes the job with the order); the task, plain sync code, records the receipt through the
  ORM under the fence, once; ``get_result`` maps leasework's states and errors onto Django's;
  a task in the process lane and an ``async def`` one in the asyncio lane use the ORM; a stale
  attempt's ORM write is refused; the project's own ``TestCase`` passes under Django's runner.
- ``examples.fastapi_shop``, FastAPI on SQLAlchemy's asyncio engine: the order and its job in
  the request's transaction, the job in the asyncio lane on an asyncpg pool, once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

import leasework
from tests.integration.conftest import DIRECT_DSN, free_port, readyz, wait_for

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "examples.django_shop.settings"
SEND_RECEIPT = "examples.django_shop.orders.tasks.send_receipt"
EXAMPLES_APP = "leasework.django:app,examples.fastapi_shop.jobs:app"


@pytest.fixture(scope="module")
def django_project(stack):
    """Django set up in this process on the stack's database, the example migrated."""
    saved = {k: os.environ.get(k) for k in ("DJANGO_SETTINGS_MODULE", "LEASEWORK_POSTGRES_DSN")}
    os.environ.update(DJANGO_SETTINGS_MODULE=SETTINGS, LEASEWORK_POSTGRES_DSN=DIRECT_DSN)
    try:
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        from examples.fastapi_shop import web  # its engine reads the DSN as it is imported

        async def tables() -> None:
            await web.create_tables()
            await web.engine.dispose()  # its pool belongs to this loop

        asyncio.run(tables())
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield


@pytest.fixture(scope="module")
def examples_worker(stack, django_project, tmp_path_factory):
    port = free_port()
    env = {
        **stack.app_env("worker-1"),
        "LEASEWORK_QUEUES": "django-shop,fastapi-shop",
        "LEASEWORK_PROCESS_NAME": "examples-worker",
        "LEASEWORK_OPS_ADDR": f"127.0.0.1:{port}",
        "LEASEWORK_POSTGRES_DSN": DIRECT_DSN,
        "DJANGO_SETTINGS_MODULE": SETTINGS,
    }
    log_path = tmp_path_factory.mktemp("examples") / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "leasework", "worker", "--app", EXAMPLES_APP],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(
                lambda: worker.poll() is None and readyz(port)[0] == 200 or worker.poll(),
                90,
                "the examples' worker ready",
            )
            assert worker.poll() is None, log_path.read_text()[-3000:]
            yield log_path
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=40)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


def _fence_of(db, job_id) -> int:
    return db.execute("SELECT fence FROM jobs WHERE id = %s", (str(job_id),)).fetchone()["fence"]


def _post_order(**body):
    from django.test import Client as DjangoClient

    return DjangoClient().post("/orders", json.dumps(body), content_type="application/json")


# ------------------------------------------------------------------------------- Django


def test_django_a_view_saves_an_order_and_its_task_runs_once_under_the_fence(
    examples_worker, client, db
):
    from examples.django_shop.orders.models import Order
    from examples.django_shop.orders.tasks import send_receipt

    response = _post_order(email="django@example.com", total_cents=1200)
    assert response.status_code == 201, response.content
    made = response.json()
    assert client.wait(made["job_id"], timeout=60) == {
        "order_id": made["order_id"],
        "sent_to": "django@example.com",
    }
    order = Order.objects.get(pk=made["order_id"])
    assert order.receipts_recorded == 1
    assert order.receipt_fence == _fence_of(db, made["job_id"])
    result = send_receipt.get_result(made["job_id"])
    assert (result.status, result.return_value) == (
        "SUCCESSFUL",
        client.get(made["job_id"])["result"],
    )
    assert result.worker_ids == ["examples-worker"] and result.attempts == 1
    assert result.errors == [] and result.finished_at is not None


def test_django_an_error_after_the_enqueue_rolls_the_job_back_with_the_order(django_project, db):
    from examples.django_shop.orders.models import Order
    from leasework.django.api import task_enqueued

    seen: list[str] = []

    def record(sender, task_result, **_):
        seen.append(task_result.id)

    task_enqueued.connect(record)
    try:
        with pytest.raises(RuntimeError, match="after the enqueue"):
            _post_order(email="rolled-back@example.com", total_cents=1, fail_after_enqueue=True)
    finally:
        task_enqueued.disconnect(record)
    assert len(seen) == 1  # it was enqueued, inside the block
    assert (
        db.execute("SELECT count(*) AS n FROM jobs WHERE id = %s", (seen[0],)).fetchone()["n"] == 0
    )
    assert not Order.objects.filter(email="rolled-back@example.com").exists()


def test_django_an_error_inside_the_door_rolls_the_callers_atomic_block_back(django_project):
    from django.db import DatabaseError, connection, transaction

    from examples.django_shop.orders.models import Order

    email = f"{uuid.uuid4().hex}@door.example"
    with pytest.raises(DatabaseError, match="queue"):
        with transaction.atomic():
            Order.objects.create(email=email, total_cents=1)
            leasework.enqueue(connection, "noop", {}, queue="no-such-queue-django")
    assert not Order.objects.filter(email=email).exists()


def test_django_results_map_leaseworks_states_and_errors(examples_worker, client):
    from examples.django_shop.orders.tasks import OrderMissing, send_receipt

    later = send_receipt.using(run_after=datetime.now(UTC) + timedelta(hours=1)).enqueue(1)
    try:
        assert send_receipt.get_result(later.id).status == "READY"
    finally:
        client.cancel(later.id)
    missing = send_receipt.enqueue(999_999_999)  # outside atomic(): committed at once
    wait_for(lambda: send_receipt.get_result(missing.id).is_finished, 60, "the task finished")
    result = send_receipt.get_result(missing.id)
    assert result.status == "FAILED" and result.attempts == 1  # leasework.Permanent: no retry
    (error,) = result.errors
    assert error.exception_class is OrderMissing
    assert "order 999999999 is gone" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value


def test_django_tasks_in_the_process_and_asyncio_lanes_use_the_orm(examples_worker, client):
    from examples.django_shop.orders.models import Order
    from examples.django_shop.orders.tasks import count_receipts, order_total

    orders = [Order.objects.create(email=f"{n}@example.com", total_cents=100 * n) for n in (1, 2)]
    total = order_total.enqueue([o.id for o in orders])
    assert client.wait(total.id, timeout=90) == 300  # a child process set Django up
    counted = count_receipts.enqueue()
    assert (
        client.wait(counted.id, timeout=60) == Order.objects.exclude(receipt_sent_at=None).count()
    )


def _claim(db, job_id) -> int:
    """A claim of the job, as the worker's claim writes it: a new fence."""
    return db.execute(
        """UPDATE jobs SET status = 'running', fence = fence + 1, attempt = attempt + 1,
                  lease_owner = 'test', lease_expires_at = now() + interval '1 minute'
            WHERE id = %s RETURNING fence""",
        (str(job_id),),
    ).fetchone()["fence"]


def test_django_a_stale_attempts_orm_write_is_refused_and_the_holders_commits(django_project, db):
    from django.db import connection, transaction
    from django.db.models import F

    from examples.django_shop.orders.models import Order
    from examples.django_shop.orders.tasks import send_receipt
    from leasework.django import fenced_atomic

    order = Order.objects.create(email="fence@example.com", total_cents=1)
    queued = send_receipt.using(run_after=datetime.now(UTC) + timedelta(hours=1)).enqueue(order.id)
    job_id = uuid.UUID(queued.id)

    def attempt(fence: int) -> leasework.JobContext:
        return leasework.JobContext(job_id, SEND_RECEIPT, 1, 5, fence, "test")

    def record(ctx: leasework.JobContext) -> None:
        with fenced_atomic(ctx):
            Order.objects.filter(pk=order.id).update(
                receipts_recorded=F("receipts_recorded") + 1, receipt_fence=ctx.fence
            )

    stale = attempt(_claim(db, job_id))
    holder = attempt(_claim(db, job_id))  # a newer claim: the first attempt's lease is gone
    with pytest.raises(leasework.StaleFence, match=f"fence {holder.fence}"):
        record(stale)
    order.refresh_from_db()
    assert (order.receipts_recorded, order.receipt_fence) == (0, None)  # rolled back
    record(holder)
    order.refresh_from_db()
    assert (order.receipts_recorded, order.receipt_fence) == (1, holder.fence)

    # the confirmation's lock holds off a newer claim until the effect commits
    blocked: list[BaseException] = []

    def claim_meanwhile() -> None:
        with psycopg.connect(DIRECT_DSN, autocommit=True) as other:
            other.execute("SET lock_timeout = '300ms'")
            try:
                other.execute("UPDATE jobs SET fence = fence + 1 WHERE id = %s", (str(job_id),))
            except psycopg.errors.LockNotAvailable as exc:
                blocked.append(exc)

    with transaction.atomic():
        holder.confirm_fence(connection)
        claimer = threading.Thread(target=claim_meanwhile)
        claimer.start()
        claimer.join()
    assert len(blocked) == 1
    with pytest.raises(leasework.FenceUnavailable, match="inside the transaction"):
        holder.confirm_fence(connection)  # autocommit, outside atomic(): refused
    db.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (str(job_id),))
    with pytest.raises(leasework.StaleFence, match="is cancelled"):
        record(holder)  # a job no longer running is held by nobody


def test_django_the_projects_own_testcase_passes_under_djangos_runner(stack):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "LEASEWORK_POSTGRES_DSN": DIRECT_DSN}
    ran = subprocess.run(
        [sys.executable, "-m", "django", "test", "examples.django_shop.orders", "--noinput"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "Ran 3 tests" in ran.stderr and "OK" in ran.stderr


# ------------------------------------------------------------------------------ FastAPI


def test_fastapi_an_order_and_its_job_commit_together_and_the_job_runs_once(
    examples_worker, client, db
):
    from examples.fastapi_shop import web

    def jobs_of_type() -> int:
        return db.execute(
            "SELECT count(*) AS n FROM jobs WHERE type = 'fastapi_shop.record_receipt'"
        ).fetchone()["n"]

    async def requests() -> tuple[httpx.Response, int, httpx.Response]:
        transport = httpx.ASGITransport(app=web.api)
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as http:
            made = await http.post("/orders", json={"email": "f@example.com", "total_cents": 9})
            before = jobs_of_type()
            failed = await http.post(
                "/orders",
                json={"email": "gone@example.com", "total_cents": 1, "fail_after_enqueue": True},
            )
        await web.engine.dispose()  # its pool belongs to this loop
        return made, before, failed

    made, before, failed = asyncio.run(requests())
    assert made.status_code == 201, made.text
    assert failed.status_code == 500 and jobs_of_type() == before  # the job went with the order
    assert (
        db.execute(
            "SELECT count(*) AS n FROM fastapi_orders WHERE email = 'gone@example.com'"
        ).fetchone()["n"]
        == 0
    )
    body = made.json()
    assert client.wait(body["job_id"], timeout=60) == {
        "order_id": body["order_id"],
        "sent_to": "f@example.com",
    }
    row = db.execute(
        "SELECT receipts_recorded, receipt_fence FROM fastapi_orders WHERE id = %s",
        (body["order_id"],),
    ).fetchone()
    assert row == {"receipts_recorded": 1, "receipt_fence": _fence_of(db, body["job_id"])}
