"""Which Prometheus alerts fired during a time window, read from the real Prometheus.

Prometheus keeps the synthetic series ``ALERTS{alertname, alertstate}`` for every active
alert; a range query over the window shows which reached ``firing`` and when first.

Ask a Prometheus that has seen only the window in question (``Stack.scratch_prometheus``):
on the stack's long-lived one, alerts with long look-back windows (SLO burn over 30 min to
3 days, dead letters over 10 min) still carry whatever earlier work did.
"""

from __future__ import annotations

import time

import httpx

from devstack.layout import PROMETHEUS_URL


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
    deadline = time.time() + timeout
    fired: dict[str, float] = {}
    while True:
        fired = fired_between(start, time.time(), url=url)
        if names <= fired.keys() or time.time() > deadline:
            return fired
        time.sleep(2.0)


def firing_now(*, url: str = PROMETHEUS_URL) -> set[str]:
    """Names of the alerts firing at this moment."""
    response = httpx.get(f"{url}/api/v1/alerts", timeout=10)
    response.raise_for_status()
    return {
        a["labels"]["alertname"]
        for a in response.json()["data"]["alerts"]
        if a["state"] == "firing"
    }
