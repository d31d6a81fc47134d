"""The overview's numbers from Prometheus: throughput and scheduling delay over the last hour
against the SLO (99% of jobs start within 5 s of their due time), the error budget left,
consumer lag, the jobs published again because Kafka lost their records, and the alerts
firing now.

One :func:`overview` call asks every query at once (a Trio nursery over one
``httpx.AsyncClient``), each bounded by :data:`TIMEOUT`. A Prometheus that cannot be reached
gives an :class:`Overview` whose ``error`` says so, and the console shows that instead of
numbers: never a blank, never a zero that looks like health. Parsing is pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import trio

TIMEOUT = 2.0  # seconds per query
WINDOW = 3600.0  # the overview's last hour
STEP = 60.0  # seconds between the points of a series

SLO_SECONDS = 5.0
SLO_TARGET = 0.99

# instant queries: name -> PromQL (the recording rules are dashboards/rules/leasework.rules.yml)
INSTANT = {
    "executed": 'sum by (outcome) (increase(leasework_jobs_executed_total{job="leasework"}[1h]))',
    "within_slo": "1 - leasework:scheduling_delay_slo:error_ratio_rate1h",
    "delay_p99": "histogram_quantile(0.99, sum by (le) "
    '(rate(leasework_scheduling_delay_seconds_bucket{job="leasework"}[1h])))',
    "budget_left": "leasework:scheduling_delay_slo:error_budget_remaining_30d",
    "consumer_lag": (
        'sum(max by (queue, priority, partition) (leasework_consumer_lag{job="leasework"}))'
    ),
    # waiting jobs whose Kafka records were lost, published again by a relay's recovery
    "lost_republished": (
        'sum(increase(leasework_lost_records_republished_total{job="leasework"}[1h]))'
    ),
    "lost_watched": 'sum(leasework_lost_records_watched_jobs{job="leasework"})',
}
# range queries over the last hour: name -> PromQL
RANGE = {
    "throughput": 'sum(rate(leasework_jobs_executed_total{job="leasework"}[2m])) * 60',
    "delay": "histogram_quantile(0.99, sum by (le) "
    '(rate(leasework_scheduling_delay_seconds_bucket{job="leasework"}[2m])))',
}


class PrometheusError(Exception):
    """Prometheus answered, but not with data (an error status, a bad query)."""


@dataclass(frozen=True)
class Alert:
    name: str
    state: str  # firing | pending
    severity: str | None
    summary: str | None
    active_at: datetime | None


Points = list[tuple[float, float]]  # (unix time, value)


@dataclass
class Overview:
    url: str
    error: str | None = None  # set: Prometheus could not be reached at all
    problems: list[str] = field(default_factory=list)  # queries that failed one by one
    executed: dict[str, float] = field(default_factory=dict)  # outcome -> last hour
    within_slo: float | None = None  # share started within SLO_SECONDS, last hour
    delay_p99: float | None = None  # seconds, last hour
    budget_left: float | None = None  # share of the 30-day error budget left
    consumer_lag: float | None = None  # messages
    lost_republished: float | None = None  # jobs published again, last hour
    lost_watched: float | None = None  # published jobs the recovery watches now
    throughput: Points = field(default_factory=list)  # jobs per minute
    delay: Points = field(default_factory=list)  # p99 seconds
    alerts: list[Alert] = field(default_factory=list)

    @property
    def reachable(self) -> bool:
        return self.error is None

    @property
    def executed_total(self) -> float:
        return sum(self.executed.values())


def _number(raw: Any) -> float | None:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) or math.isinf(value) else value


def _data(document: Any) -> Any:
    if not isinstance(document, dict) or document.get("status") != "success":
        error = document.get("error") if isinstance(document, dict) else None
        raise PrometheusError(str(error or "not a Prometheus answer"))
    return document["data"]


def scalar(document: Any) -> float | None:
    """The one value of an instant vector; None when it has no sample (or NaN)."""
    result = _data(document)["result"]
    return _number(result[0]["value"][1]) if result else None


def by_label(document: Any, label: str) -> dict[str, float]:
    """An instant vector as label value -> value (samples without a number left out)."""
    out: dict[str, float] = {}
    for sample in _data(document)["result"]:
        value = _number(sample["value"][1])
        if value is not None:
            out[sample["metric"].get(label, "")] = value
    return out


def points(document: Any) -> Points:
    """The first series of a range query as (time, value) pairs, gaps left out."""
    result = _data(document)["result"]
    if not result:
        return []
    out: Points = []
    for t, raw in result[0]["values"]:
        value = _number(raw)
        if value is not None:
            out.append((float(t), value))
    return out


# always firing by design, so a receiver notices silence: not news on the overview
DEADMAN = "LeaseworkWatchdog"


def alerts(document: Any) -> list[Alert]:
    """Firing alerts first, then pending, each by name; the deadman left out."""
    found = []
    for a in _data(document)["alerts"]:
        if a["labels"].get("alertname") == DEADMAN:
            continue
        active = a.get("activeAt")
        try:
            active_at = datetime.fromisoformat(active.replace("Z", "+00:00")) if active else None
        except ValueError:
            active_at = None
        found.append(
            Alert(
                name=a["labels"].get("alertname", "?"),
                state=a.get("state", "?"),
                severity=a["labels"].get("severity"),
                summary=a.get("annotations", {}).get("summary"),
                active_at=active_at,
            )
        )
    return sorted(found, key=lambda a: (a.state != "firing", a.name))


async def _get(client: httpx.AsyncClient, url: str, params: dict[str, Any]) -> Any:
    response = await client.get(url, params=params, timeout=TIMEOUT)
    try:
        document = response.json()
    except ValueError:
        raise PrometheusError(f"HTTP {response.status_code}, not JSON") from None
    _data(document)
    return document


async def overview(client: httpx.AsyncClient, base_url: str, now: float) -> Overview:
    """Ask every overview query at once; see the module docstring for failures."""
    result = Overview(url=base_url)
    documents: dict[str, Any] = {}
    unreachable: list[str] = []

    async def fetch(name: str, path: str, params: dict[str, Any]) -> None:
        try:
            documents[name] = await _get(client, base_url + path, params)
        except httpx.TransportError as exc:
            unreachable.append(f"{type(exc).__name__}: {exc}".rstrip(": "))
        except (httpx.HTTPError, PrometheusError) as exc:
            result.problems.append(f"{name}: {exc}")

    async with trio.open_nursery() as nursery:
        for name, query in INSTANT.items():
            nursery.start_soon(fetch, name, "/api/v1/query", {"query": query, "time": now})
        for name, query in RANGE.items():
            span = {"query": query, "start": now - WINDOW, "end": now, "step": STEP}
            nursery.start_soon(fetch, name, "/api/v1/query_range", span)
        nursery.start_soon(fetch, "alerts", "/api/v1/alerts", {})
    if unreachable and not documents:
        result.error = f"Prometheus at {base_url} cannot be reached ({unreachable[0]})"
        return result
    result.problems += [f"no answer: {u}" for u in unreachable[:1]]
    readers = {
        "executed": lambda d: setattr(result, "executed", by_label(d, "outcome")),
        "within_slo": lambda d: setattr(result, "within_slo", scalar(d)),
        "delay_p99": lambda d: setattr(result, "delay_p99", scalar(d)),
        "budget_left": lambda d: setattr(result, "budget_left", scalar(d)),
        "consumer_lag": lambda d: setattr(result, "consumer_lag", scalar(d)),
        "lost_republished": lambda d: setattr(result, "lost_republished", scalar(d)),
        "lost_watched": lambda d: setattr(result, "lost_watched", scalar(d)),
        "throughput": lambda d: setattr(result, "throughput", points(d)),
        "delay": lambda d: setattr(result, "delay", points(d)),
        "alerts": lambda d: setattr(result, "alerts", alerts(d)),
    }
    for name, document in documents.items():
        try:
            readers[name](document)
        except (PrometheusError, KeyError, IndexError, TypeError, AttributeError) as exc:
            result.problems.append(f"{name}: unexpected answer ({exc!r})")
    return result
