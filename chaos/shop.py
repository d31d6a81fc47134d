"""The example shop's tables in a chaos run (examples/shop/schema.sql).

A ``receipt`` submit places an order through the shop; its ``send_receipt`` job emails the
receipt through the mail service (``shop_mail``: one row per idempotency key, ``calls``
counting every call) and records it on the order through the fence
(``shop_orders.receipts_recorded += 1``). For the checker, each recorded receipt is one
effect of kind ``receipt`` of the order's job, so an order recorded twice is a doubled effect
exactly like a ledger job with two ``effects`` rows. The mail ledger is informational: emails
sent against calls made shows the job's idempotency key at work.

:func:`read_shop` reads (blocking); :func:`receipt_effects` and :func:`shop_view` are pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import psycopg

RECEIPT_EFFECT = "receipt"
# the key the send_receipt handler hands the mail service: ctx.idempotency_key
MAIL_KEY_PREFIX = "leasework:"


def read_shop(conn: psycopg.Connection[Any], like: str) -> dict[str, list[dict[str, Any]]]:
    """The shop's rows for the run's jobs (``jobs.idempotency_key LIKE like``): the orders
    whose receipt job is one of them, and the mail ledger's rows under those jobs' keys. Empty
    when the shop's tables do not exist (it never ran on this database). ``conn`` returns
    rows as dicts."""
    present = conn.execute(
        "SELECT to_regclass('shop_orders') IS NOT NULL AND to_regclass('shop_mail') IS NOT NULL "
        "AS present"
    ).fetchone()
    if not present or not present["present"]:
        return {"shop_orders": [], "shop_mail": []}
    orders = conn.execute(
        "SELECT o.id AS order_id, o.receipt_job_id::text AS job_id, o.receipts_recorded, "
        "o.idempotency_key FROM shop_orders o JOIN jobs j ON j.id = o.receipt_job_id "
        "WHERE j.idempotency_key LIKE %s ORDER BY o.id",
        (like,),
    ).fetchall()
    mail = conn.execute(
        "SELECT m.idempotency_key, j.id::text AS job_id, m.calls FROM shop_mail m "
        "JOIN jobs j ON m.idempotency_key = %s || j.id::text "
        "WHERE j.idempotency_key LIKE %s ORDER BY m.first_sent_at, m.idempotency_key",
        (MAIL_KEY_PREFIX, like),
    ).fetchall()
    return {"shop_orders": orders, "shop_mail": mail}


def receipt_effects(orders: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One effect row ``{"job_id", "fence", "kind"}`` per receipt recorded on each order, for
    the order's receipt job. The shop records no fence: ``fence`` is None."""
    return [
        {"job_id": str(order["job_id"]), "fence": None, "kind": RECEIPT_EFFECT}
        for order in orders
        if order.get("job_id") is not None
        for _ in range(int(order.get("receipts_recorded") or 0))
    ]


@dataclass(frozen=True)
class ShopView:
    """The run's orders and emails.

    ``orders_doubled``: orders whose receipt was recorded more than once (the checker's
    ``doubled``). ``emails`` against ``mail_calls``: messages the mail service sent against
    the calls it got; ``emails_called_again`` were asked for more than once (a retried or
    re-run handler) and sent once, thanks to the idempotency key."""

    orders: int
    receipts_recorded: int
    orders_without_receipt: int
    orders_doubled: int
    emails: int
    mail_calls: int
    emails_called_again: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shop_view(orders: Iterable[Mapping[str, Any]], mail: Iterable[Mapping[str, Any]]) -> ShopView:
    recorded = [int(o.get("receipts_recorded") or 0) for o in orders]
    calls = [int(m.get("calls") or 0) for m in mail]
    return ShopView(
        orders=len(recorded),
        receipts_recorded=sum(recorded),
        orders_without_receipt=sum(1 for n in recorded if n == 0),
        orders_doubled=sum(1 for n in recorded if n > 1),
        emails=len(calls),
        mail_calls=sum(calls),
        emails_called_again=sum(1 for n in calls if n > 1),
    )
