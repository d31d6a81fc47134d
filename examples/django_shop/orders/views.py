"""``POST /orders`` saves an order and enqueues its receipt in one transaction: both commit,
or neither does (an error after the enqueue rolls the job back with the order)."""

from __future__ import annotations

import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from examples.django_shop.orders.models import Order
from examples.django_shop.orders.tasks import send_receipt


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    try:
        body = json.loads(request.body)
        email, total = str(body["email"]), int(body["total_cents"])
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": "send {email, total_cents}"}, status=422)
    with transaction.atomic():
        order = Order.objects.create(email=email, total_cents=total)
        result = send_receipt.enqueue(order.id)
        if body.get("fail_after_enqueue"):  # the example's proof: the job goes with the order
            raise RuntimeError("failed after the enqueue")
    return JsonResponse({"order_id": order.id, "job_id": result.id}, status=201)


@require_GET
def order(request: HttpRequest, order_id: int) -> JsonResponse:
    found = Order.objects.filter(pk=order_id).values().first()
    if found is None:
        return JsonResponse({"error": "no such order"}, status=404)
    return JsonResponse(found)


@require_GET
def result(request: HttpRequest, result_id: str) -> JsonResponse:
    task_result = send_receipt.get_backend().get_result(result_id)
    body = {
        "status": task_result.status,
        "attempts": task_result.attempts,
        "errors": [e.exception_class_path for e in task_result.errors],
    }
    if task_result.is_finished and task_result.status == "SUCCESSFUL":
        body["return_value"] = task_result.return_value
    return JsonResponse(body)
