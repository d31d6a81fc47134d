"""Alerts that reach someone, without servers: which rows of ``alert_notifications`` count as
a run's alert delivered through Alertmanager, and how the run's record and report show it."""

from __future__ import annotations

from datetime import UTC, datetime

from chaos.alerts import AlertArrival, first_deliveries
from chaos.record import AlertsSeen
from chaos.report import alerts_markdown
from devstack.services.prometheus import scratch_labels
from leasework.store.operators import AlertNotification

T0 = 1_800_000_000.0  # the run's start, Unix time
RUN = scratch_labels("chaos-k-1")


def row(
    alertname: str,
    received: float,
    *,
    status: str = "firing",
    labels: dict[str, str] | None = None,
    receiver: str = "leasework-api",
    starts: float | None = None,
) -> AlertNotification:
    at = datetime.fromtimestamp(T0 + received, UTC)
    starts_at = datetime.fromtimestamp(T0 + starts, UTC) if starts is not None else None
    return AlertNotification(
        id=int(received * 10),
        received_at=at,
        alertname=alertname,
        status=status,
        severity="page",
        summary=None,
        starts_at=starts_at,
        ends_at=None,
        labels={"alertname": alertname, **(RUN if labels is None else labels)},
        receiver=receiver,
    )


def test_a_delivery_is_the_first_firing_notification_of_this_runs_prometheus():
    rows = [
        row("LeaseworkRelayStalled", 80.0, starts=78.0),
        row("LeaseworkRelayStalled", 75.0, starts=74.0),  # earlier: this one counts
        row("LeaseworkRelayStalled", 90.0, status="resolved"),
        # the stack's own Prometheus, another run's scratch one, before the fault, elsewhere
        row("LeaseworkOutboxBacklog", 70.0, labels={"prometheus": "stack"}),
        row("LeaseworkOutboxBacklog", 71.0, labels=scratch_labels("chaos-k-0")),
        row("LeaseworkOutboxBacklog", 5.0),
        row("LeaseworkOutboxBacklog", 72.0, receiver="someone-else"),
        row("LeaseworkDeadLetters", 40.0),
    ]
    found = first_deliveries(rows, RUN, since=T0 + 10.0)
    assert found == {
        "LeaseworkRelayStalled": AlertArrival("LeaseworkRelayStalled", T0 + 75.0, T0 + 74.0),
        "LeaseworkDeadLetters": AlertArrival("LeaseworkDeadLetters", T0 + 40.0, None),
    }
    assert first_deliveries(rows, scratch_labels("nobody"), since=T0) == {}


def test_the_record_and_the_report_show_when_each_alert_fired_and_arrived():
    seen = AlertsSeen.of(
        ["LeaseworkRelayStalled", "LeaseworkOutboxBacklog"],
        set(),
        {"LeaseworkRelayStalled": T0 + 72.0, "LeaseworkOutboxBacklog": T0 + 100.0},
        T0,
        {"LeaseworkRelayStalled": AlertArrival("LeaseworkRelayStalled", T0 + 73.25, T0 + 71.0)},
        fault_epoch=T0 + 10.0,
    )
    data = seen.to_dict()
    (name, delivery) = next(iter(data["delivered"].items()))
    assert name == "LeaseworkRelayStalled"
    assert delivery == {
        "fired": 72.0,
        "starts_at": "2027-01-15T08:01:11.000+00:00",
        "received_at": "2027-01-15T08:01:13.250+00:00",
        "received": 73.2,
        "after_fault": 63.2,
    }
    text = "\n".join(alerts_markdown(data))
    assert "| LeaseworkRelayStalled | 72 | 2027-01-15T08:01:11.000+00:00 |" in text
    assert "| 73.2 | 63.2 |" in text
    assert "not delivered**: LeaseworkOutboxBacklog." in text
    unread = AlertsSeen.of(["X"], set(), {"X": T0 + 1}, T0, None).to_dict()
    assert unread["delivered"] is None
    assert "could not be read" in alerts_markdown(unread)[-1]
