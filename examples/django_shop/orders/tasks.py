"""The example's tasks: plain Django code, run by a leasework worker of
``leasework.django:app`` in its thread lane (``order_total`` in its process lane)."""

from __future__ import annotations

from django.db.models import F
from django.utils import timezone

try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # the backport, on Django 4.2-5.2

import leasework
from examples.django_shop.orders.models import Order
from leasework.django import current_attempt, fenced_atomic


class OrderMissing(leasework.Permanent):
    """Retrying cannot bring an order back: the job goes to ``dead`` at once."""


@task(queue_name="django-shop")
def send_receipt(order_id: int) -> dict:
    """Record the receipt on the order through the fence: the write commits only while this
    attempt holds the job, so an attempt that lost its lease records nothing."""
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        raise OrderMissing(f"order {order_id} is gone")
    # ... send the email here, with current_attempt().idempotency_key for the mail service
    with fenced_atomic():
        Order.objects.filter(pk=order_id).update(
            receipt_sent_at=timezone.now(),
            receipt_fence=current_attempt().fence,
            receipts_recorded=F("receipts_recorded") + 1,
        )
    return {"order_id": order_id, "sent_to": order.email}


@task(queue_name="django-shop")
def order_total(order_ids: list[int]) -> int:
    """CPU-light here, but declared for the process lane (``JOB_TYPES``), where each child
    sets Django up once: the ORM works there as in the thread lane."""
    return sum(Order.objects.filter(pk__in=order_ids).values_list("total_cents", flat=True))


@task(queue_name="django-shop")
async def count_receipts() -> int:
    """An ``async def`` task: the asyncio lane, Django's async ORM."""
    return await Order.objects.filter(receipt_sent_at__isnull=False).acount()
