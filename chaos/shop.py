"""The example shop's tables in a chaos run (examples/shop/schema.sql).

A ``receipt`` submit places an order through the shop; its ``send_receipt`` job emails the
receipt through the mail service and records it on the order through the fence
(``shop_orders.receipts_recorded += 1``). The mail service logs every email it sent with the
calling job and fence (``shop_emails``), every call it refused as stale
(``shop_mail_refused``), and under its key guard one row per idempotency key (``shop_mail``,
``calls`` counting every call).

For the checker, each recorded receipt is one effect of kind ``receipt`` of the order's job
and each email sent one effect of kind ``email``, with its fence: an order recorded twice, or
emailed twice, is a doubled effect exactly like a ledger job with two ``effects`` rows.

:func:`read_shop` reads (blocking); :func:`receipt_effects`, :func:`email_effects` and
:func:`shop_view` are pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import psycopg

RECEIPT_EFFECT = "receipt"
EMAIL_EFFECT = "email"
# the key the send_receipt handler hands the mail service: ctx.idempotency_key
MAIL_KEY_PREFIX = "leasework:"


def read_shop(conn: psycopg.Connection[Any], like: str) -> dict[str, list[dict[str, Any]]]:
    """The shop's rows for the run's jobs (``jobs.idempotency_key LIKE like``): the orders
    whose receipt job is one of them, the mail ledger's rows under those jobs' keys, the
    emails those jobs caused and the calls of theirs refused as stale. Empty when the shop's
    tables do not exist (it never ran on this database). ``conn`` returns rows as dicts."""
    empty: dict[str, list[dict[str, Any]]] = {
        "shop_orders": [],
        "shop_mail": [],
        "shop_emails": [],
        "shop_mail_refused": [],
    }
    present = conn.execute(
        "SELECT to_regclass('shop_orders') IS NOT NULL AND to_regclass('shop_mail') IS NOT NULL "
        "AND to_regclass('shop_emails') IS NOT NULL "
        "AND to_regclass('shop_mail_refused') IS NOT NULL AS present"
    ).fetchone()
    if not present or not present["present"]:
        return empty
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
    emails = conn.execute(
        "SELECT e.job_id::text AS job_id, e.fence, e.sent_at FROM shop_emails e "
        "JOIN jobs j ON j.id = e.job_id WHERE j.idempotency_key LIKE %s ORDER BY e.id",
        (like,),
    ).fetchall()
    refused = conn.execute(
        "SELECT r.job_id::text AS job_id, r.fence, r.highest, r.refused_at "
        "FROM shop_mail_refused r JOIN jobs j ON j.id = r.job_id "
        "WHERE j.idempotency_key LIKE %s ORDER BY r.id",
        (like,),
    ).fetchall()
    return {
        **empty,
        "shop_orders": orders,
        "shop_mail": mail,
        "shop_emails": emails,
        "shop_mail_refused": refused,
    }


def receipt_effects(orders: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One effect row ``{"job_id", "fence", "kind"}`` per receipt recorded on each order, for
    the order's receipt job. The shop records no fence: ``fence`` is None."""
    return [
        {"job_id": str(order["job_id"]), "fence": None, "kind": RECEIPT_EFFECT}
        for order in orders
        if order.get("job_id") is not None
        for _ in range(int(order.get("receipts_recorded") or 0))
    ]


def email_effects(emails: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One effect row ``{"job_id", "fence", "kind": "email"}`` per email the mail service
    sent for a job of the run (``shop_emails``, in the order sent)."""
    return [
        {"job_id": str(e["job_id"]), "fence": e.get("fence"), "kind": EMAIL_EFFECT}
        for e in emails
        if e.get("job_id") is not None
    ]


def stale_emails(emails: Iterable[Mapping[str, Any]]) -> int:
    """Emails sent for a fence lower than one already sent for the same job (in the order
    sent): what the fence guard refuses. A later email of a higher fence is a repeat the
    fence allows (a newer attempt after an older one's call landed: the key's to stop)."""
    highest: dict[str, int] = {}
    stale = 0
    for e in emails:
        job, fence = str(e.get("job_id")), e.get("fence")
        if fence is None:
            continue
        if fence < highest.get(job, 0):
            stale += 1
        highest[job] = max(highest.get(job, 0), int(fence))
    return stale


@dataclass(frozen=True)
class ShopView:
    """The run's orders and emails.

    ``orders_doubled``: orders whose receipt was recorded more than once (the checker's
    ``doubled``). ``emails``: messages the mail service sent for the run's jobs;
    ``jobs_emailed_twice`` got more than one (doubled too), ``stale_emails`` of them sent for
    a fence lower than one already sent (what the fence guard stops). ``mail_refusals``:
    calls refused as stale. Under the key guard, ``mail_calls`` calls for ``keyed_emails``
    keys, ``emails_called_again`` of them asked for more than once and sent once."""

    orders: int
    receipts_recorded: int
    orders_without_receipt: int
    orders_doubled: int
    emails: int
    mail_calls: int
    emails_called_again: int
    jobs_emailed_twice: int = 0
    stale_emails: int = 0
    mail_refusals: int = 0
    keyed_emails: int = 0
    guard: str = "key,fence"  # the mail service's guards in the run (SHOP_MAIL_GUARD)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shop_view(
    orders: Iterable[Mapping[str, Any]],
    mail: Iterable[Mapping[str, Any]],
    emails: Iterable[Mapping[str, Any]] = (),
    refused: Iterable[Mapping[str, Any]] = (),
    guard: str | None = None,
) -> ShopView:
    recorded = [int(o.get("receipts_recorded") or 0) for o in orders]
    calls = [int(m.get("calls") or 0) for m in mail]
    sent = list(emails)
    per_job = Counter(str(e.get("job_id")) for e in sent if e.get("job_id") is not None)
    return ShopView(
        orders=len(recorded),
        receipts_recorded=sum(recorded),
        orders_without_receipt=sum(1 for n in recorded if n == 0),
        orders_doubled=sum(1 for n in recorded if n > 1),
        emails=len(sent),
        mail_calls=sum(calls),
        emails_called_again=sum(1 for n in calls if n > 1),
        jobs_emailed_twice=sum(1 for n in per_job.values() if n > 1),
        stale_emails=stale_emails(sent),
        mail_refusals=len(list(refused)),
        keyed_emails=len(calls),
        guard=guard or "key,fence",
    )
