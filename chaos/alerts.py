"""Which Prometheus alerts fired during a time window, read from the real Prometheus, and
which of them reached someone: a notification through Alertmanager to the api's webhook.

Prometheus keeps the synthetic series ``ALERTS{alertname, alertstate}`` for every active
alert; a range query over the window shows which reached ``firing`` and when first. Every
Prometheus of the stack sends its alerts to the stack's Alertmanager, which routes each to
the api's ``POST /alerts/webhook``; the api records it in ``alert_notifications`` with its
labels, among them the sending Prometheus's external labels (``prometheus="scratch"`` and the
run's ``scratch_run``), so :func:`first_deliveries` can pick the notifications one scratch
Prometheus caused.

Ask a Prometheus that has seen only the window in question (``Stack.scratch_prometheus``,
:class:`RunPrometheus`): on the stack's long-lived one, alerts with long look-back windows
(SLO burn over 30 min to 3 days, dead letters over 10 min) still carry whatever earlier work
did.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import psycopg
import trio
from psycopg.rows import dict_row

from chaos.poll import poll
from devstack.layout import ALERT_RECEIVER, POSTGRES_DIRECT_DSN, PROMETHEUS_URL
from devstack.services.prometheus import scratch_labels
from leasework.store.operators import AlertNotification, alerts_list

if TYPE_CHECKING:
    from chaos.stack import StackCalls

# how long to wait, after quiet, for an expected alert that has not fired yet: SLO burn
# alerts fire only once the late jobs have started, then hold 1-2 min (`for:`); scenario l's
# SLOBurnSlow (`for: 2m`) missed a 150 s wait once on a loaded machine
ALERT_PATIENCE = 240.0
# how long to wait, once an alert has fired, for its notification: Prometheus sends it at
# once, Alertmanager 1 s later (group_wait) and retries a failed webhook every 5 s
DELIVERY_PATIENCE = 30.0


def fired_between(
    start: float, end: float, *, url: str = PROMETHEUS_URL, step: float = 2.0
) -> dict[str, float]:
    """Alert name -> first Unix time it was firing within [start, end]."""
    response = httpx.get(
        f"{url}/api/v1/query_range",
        params={
            "query": 'ALERTS{alertstate="firing"}',
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{step:g}",
        },
        timeout=10,
    )
    response.raise_for_status()
    fired: dict[str, float] = {}
    for series in response.json()["data"]["result"]:
        first = min(float(t) for t, _ in series["values"])
        name = series["metric"]["alertname"]
        fired[name] = min(first, fired.get(name, first))
    return fired


def wait_for_alerts(
    names: set[str], start: float, timeout: float, *, url: str = PROMETHEUS_URL
) -> dict[str, float]:
    """Poll until every alert in ``names`` has fired since ``start`` (or ``timeout`` passes);
    returns what fired."""
    return poll(
        lambda: fired_between(start, time.time(), url=url),
        lambda fired: names <= fired.keys(),
        patience=timeout,
        interval=2.0,
    ).value


def firing_now(*, url: str = PROMETHEUS_URL) -> set[str]:
    """Names of the alerts firing at this moment."""
    response = httpx.get(f"{url}/api/v1/alerts", timeout=10)
    response.raise_for_status()
    return {
        a["labels"]["alertname"]
        for a in response.json()["data"]["alerts"]
        if a["state"] == "firing"
    }


@dataclass(frozen=True)
class AlertArrival:
    """An alert's first firing notification that reached the api through Alertmanager:
    when the api recorded it, and when Prometheus says the alert started (its ``startsAt``,
    the time it became firing). Unix times."""

    alertname: str
    received_at: float
    starts_at: float | None


def first_deliveries(
    rows: Iterable[AlertNotification], labels: Mapping[str, str], since: float
) -> dict[str, AlertArrival]:
    """Alert name -> the first notification among ``rows`` that is firing, reached the
    receiver ``leasework-api``, was received at or after ``since`` and carries every one
    of ``labels`` (pure)."""
    found: dict[str, AlertArrival] = {}
    for row in rows:
        received = row.received_at.timestamp()
        if (
            row.status != "firing"
            or row.receiver != ALERT_RECEIVER
            or received < since
            or any(row.labels.get(k) != v for k, v in labels.items())
        ):
            continue
        first = found.get(row.alertname)
        if first is None or received < first.received_at:
            starts = row.starts_at.timestamp() if row.starts_at is not None else None
            found[row.alertname] = AlertArrival(row.alertname, received, starts)
    return found


def read_deliveries(run: str, since: float) -> dict[str, AlertArrival]:
    """The first firing notification of each alert the scratch Prometheus of run ``run``
    caused, received since ``since`` (blocking; read straight from Postgres)."""
    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True, row_factory=dict_row) as conn:
        rows = alerts_list(conn, since=datetime.fromtimestamp(since, UTC), limit=10_000)
    return first_deliveries(rows, scratch_labels(run), since)


def wait_for_deliveries(
    names: Collection[str], run: str, since: float, timeout: float = DELIVERY_PATIENCE
) -> dict[str, AlertArrival]:
    """Poll until a notification of every alert in ``names`` has arrived (or ``timeout``
    passes); returns what arrived."""
    return poll(
        lambda: read_deliveries(run, since),
        lambda delivered: set(names) <= delivered.keys(),
        patience=timeout,
        interval=1.0,
    ).value


class RunPrometheus:
    """A Prometheus of the run's own (``Stack.scratch_prometheus``): empty TSDB, the stack's
    targets and rules, started before the workload and stopped after the check. Alerts are
    judged on it, not on the stack's long-lived Prometheus, whose 10-minute to 3-day windows
    still hold earlier runs' faults: there, an alert already firing from the previous scenario
    could not be credited to this one, and a slow SLO burn left by it would show up here.
    ``url`` is None when it could not start; the alert checks then say so (UNKNOWN). Its
    alerts reach Alertmanager labelled ``scratch_run=run``."""

    def __init__(self, calls: StackCalls, say: Callable[[str], None], run: str) -> None:
        self._calls = calls
        self._say = say
        self.run = run
        self._workdir = tempfile.TemporaryDirectory(prefix="leasework-chaos-prometheus-")
        self._context: contextlib.AbstractContextManager[str] | None = None
        self.url: str | None = None

    async def start(self) -> None:
        context = self._calls.stack.scratch_prometheus(Path(self._workdir.name), run=self.run)
        try:
            self.url = await self._calls(context.__enter__)
        except Exception as exc:  # the run goes on; its alert expectations become UNKNOWN
            self._say(f"prometheus: the run's own Prometheus did not start ({exc})")
            return
        self._context = context
        self._say(f"prometheus: the run's alerts are judged on {self.url} (empty TSDB)")

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            if self._context is not None:
                await self._calls(self._context.__exit__, None, None, None)
                self._context = None
            self._workdir.cleanup()

    async def firing_now(self) -> set[str] | None:
        if self.url is None:
            return None
        try:
            return await trio.to_thread.run_sync(functools.partial(firing_now, url=self.url))
        except (httpx.HTTPError, ValueError, KeyError):
            return None

    async def fired_during(
        self, expected: Sequence[str], start_epoch: float
    ) -> dict[str, float] | None:
        """Alert name -> first Unix time it was firing since ``start_epoch``; waits up to
        ALERT_PATIENCE for the expected ones. None when Prometheus cannot be asked."""
        if self.url is None:
            return None
        try:
            if expected:
                wait = functools.partial(
                    wait_for_alerts, set(expected), start_epoch, ALERT_PATIENCE, url=self.url
                )
            else:
                wait = functools.partial(fired_between, start_epoch, time.time(), url=self.url)
            return await trio.to_thread.run_sync(wait)
        except (httpx.HTTPError, ValueError, KeyError):
            return None

    async def delivered(
        self, names: Collection[str], since: float
    ) -> dict[str, AlertArrival] | None:
        """The notifications of this run's alerts received since ``since``; waits up to
        DELIVERY_PATIENCE for those of ``names``. None when they cannot be read."""
        if self.url is None:
            return None
        wait = functools.partial(wait_for_deliveries, names, self.run, since)
        try:
            return await trio.to_thread.run_sync(wait)
        except psycopg.Error as exc:
            self._say(f"alerts: cannot read alert_notifications ({exc})")
            return None
