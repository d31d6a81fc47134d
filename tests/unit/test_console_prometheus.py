"""The overview's Prometheus answers, parsed (leasework/api/console/prometheus.py), and its
charts (leasework/api/console/charts.py)."""

import socket

import httpx
import pytest

from leasework.api.console import prometheus
from leasework.api.console.charts import line_chart


def vector(*samples):
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": m, "value": [1700000000.0, v]} for m, v in samples],
        },
    }


def test_scalar_and_labelled_vectors():
    assert prometheus.scalar(vector(({}, "0.975"))) == 0.975
    assert prometheus.scalar(vector()) is None  # no sample: unknown, not zero
    assert prometheus.scalar(vector(({}, "NaN"))) is None
    answer = vector(({"outcome": "succeeded"}, "120"), ({"outcome": "dead"}, "3"))
    assert prometheus.by_label(answer, "outcome") == {"succeeded": 120.0, "dead": 3.0}


def test_an_error_answer_is_an_error_not_an_empty_result():
    with pytest.raises(prometheus.PrometheusError, match="parse error"):
        prometheus.scalar({"status": "error", "errorType": "bad_data", "error": "parse error"})
    with pytest.raises(prometheus.PrometheusError):
        prometheus.scalar(["not", "prometheus"])


def test_range_points_skip_gaps():
    answer = {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [
            [100, "1"], [160, "NaN"], [220, "3.5"]]}]},
    }  # fmt: skip
    assert prometheus.points(answer) == [(100.0, 1.0), (220.0, 3.5)]
    assert prometheus.points({"status": "success", "data": {"result": []}}) == []


def test_alerts_firing_first():
    answer = {
        "status": "success",
        "data": {
            "alerts": [
                {"labels": {"alertname": "B", "severity": "ticket"}, "state": "pending"},
                {
                    "labels": {"alertname": "A", "severity": "page"},
                    "annotations": {"summary": "relay stalled"},
                    "state": "firing",
                    "activeAt": "2026-01-02T03:04:05.123Z",
                },
            ]
        },
    }
    found = prometheus.alerts(answer)
    assert [(a.name, a.state) for a in found] == [("A", "firing"), ("B", "pending")]
    assert found[0].summary == "relay stalled" and found[0].active_at.year == 2026


def test_the_deadman_is_not_news_on_the_overview():
    from devstack.services.alertmanager import WATCHDOG

    assert prometheus.DEADMAN == WATCHDOG  # the rule the stack routes to the receiver
    answer = {
        "status": "success",
        "data": {
            "alerts": [
                {"labels": {"alertname": WATCHDOG}, "state": "firing"},
                {"labels": {"alertname": "A"}, "state": "firing"},
            ]
        },
    }
    assert [a.name for a in prometheus.alerts(answer)] == ["A"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on return: nothing listens there


async def test_an_unreachable_prometheus_says_so():
    url = f"http://127.0.0.1:{closed_port()}"
    async with httpx.AsyncClient() as client:
        result = await prometheus.overview(client, url, now=1700000000.0)
    assert not result.reachable
    assert result.error.startswith(f"Prometheus at {url} cannot be reached (ConnectError")
    assert result.within_slo is None and result.budget_left is None and result.alerts == []


def test_a_chart_scales_into_its_box_and_keeps_the_threshold_in_view():
    chart = line_chart([(0, 1.0), (50, 2.0), (100, 0.5)], start=0, end=100, threshold=5.0,
                       width=100, height=108)  # fmt: skip
    assert chart.y_max == pytest.approx(5.5)  # the 5 s line is inside the box
    xs = [float(p.split(",")[0]) for p in chart.points.split()]
    assert xs == [0.0, 50.0, 100.0]
    assert 4 <= chart.threshold_y <= 104 and chart.latest == 0.5
    assert line_chart([], start=0, end=100).empty
    # a point outside the window is not drawn; a negative value sits on the axis
    clipped = line_chart([(-10, 9.0), (10, -3.0)], start=0, end=100)
    assert clipped.points == "60.0,116.0" and clipped.y_max == 1.0 and clipped.latest == -3.0
