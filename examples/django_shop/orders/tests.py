"""The example's own Django tests (``django-admin test examples.django_shop.orders``): a
task run as the worker runs it, inside a ``TestCase``'s transaction, and the view's
enqueue into the test database (which Django's migrate gave leasework's schema)."""

from __future__ import annotations

import json

from django.db import connection
from django.test import TestCase

from examples.django_shop.orders.models import Order
from examples.django_shop.orders.tasks import send_receipt
from leasework.django.testing import make_queues, run_task


class SendReceiptTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        make_queues("django-shop")

    def test_the_receipt_is_recorded_once_on_the_tests_own_order(self):
        order = Order.objects.create(email="a@example.com", total_cents=1200)
        run = run_task(send_receipt, order.id)
        self.assertTrue(run.succeeded, run.error)
        self.assertEqual(run.result, {"order_id": order.id, "sent_to": "a@example.com"})
        order.refresh_from_db()
        self.assertEqual(order.receipts_recorded, 1)

    def test_a_missing_order_is_dead_at_once_with_its_exception_named(self):
        run = run_task(send_receipt, 999_999_999)
        self.assertEqual(run.status, "dead")
        self.assertIn("examples.django_shop.orders.tasks.OrderMissing", run.error)

    def test_the_view_enqueues_its_job_in_the_tests_transaction(self):
        response = self.client.post(
            "/orders",
            json.dumps({"email": "b@example.com", "total_cents": 500}),
            content_type="application/json",
        )
        self.assertEqual(response.status_code, 201)
        with connection.cursor() as cursor:
            cursor.execute("SELECT type FROM jobs WHERE id = %s", [response.json()["job_id"]])
            self.assertEqual(cursor.fetchone(), ("examples.django_shop.orders.tasks.send_receipt",))
