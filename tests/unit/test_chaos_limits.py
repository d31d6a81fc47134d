"""The limits judge's pure parts: spans in flight at once, and what the judge says."""

from __future__ import annotations

from datetime import UTC, datetime

from chaos.judge import limits_held, rates_held
from chaos.limits import LimitView, most_in_flight, most_in_window, rate_view_of, view_of


def test_the_most_spans_in_flight_at_once():
    assert most_in_flight([]) == 0
    assert most_in_flight([(0, 1), (1, 2), (2, 3)]) == 1  # end to end: never two at once
    assert most_in_flight([(0, 3), (1, 2), (1.5, 4), (3.5, 5)]) == 3
    assert most_in_flight([(0, 10), (1, 2), (3, 4), (5, 6)]) == 2


def test_effect_rows_become_spans_per_key():
    at = lambda s: datetime.fromtimestamp(s, UTC)  # noqa: E731
    rows = [
        {"key": "a", "began": 0.0, "ended": at(2)},
        {"key": "a", "began": 1.0, "ended": at(3)},
        {"key": "a", "began": 1.5, "ended": at(4)},
        {"key": "b", "began": 0.0, "ended": at(1)},
    ]
    view = view_of(rows)
    assert view.most == {"a": 3, "b": 1} and view.effects == 4
    assert view.over == {"a": 3} and "OVER on 1 key" in view.cell()


class Evidence:
    def __init__(self, limits):
        self.limits = limits


def test_the_judge_fails_a_key_over_its_limit_and_knows_nothing_from_keys_below_it():
    assert list(limits_held(Evidence(None))) == []  # type: ignore[arg-type]
    assert list(limits_held(Evidence(LimitView({"a": 2, "b": 1}, 9)))) == []  # type: ignore[arg-type]
    (over,) = limits_held(Evidence(LimitView({"a": 3}, 9)))  # type: ignore[arg-type]
    assert over.valid is False and "a: 3" in over.message
    (idle,) = limits_held(Evidence(LimitView({"a": 1}, 9)))  # type: ignore[arg-type]
    assert idle.valid == "unknown" and "reached" in idle.message


def test_the_most_starts_within_a_second():
    assert most_in_window([]) == 0
    assert most_in_window([0.0, 0.2, 0.4, 0.6, 0.8, 1.0]) == 5  # 1.0 is the next second's
    assert most_in_window([0.0, 0.2, 0.4, 0.6, 0.8, 0.99]) == 6
    assert most_in_window([0.0] * 3 + [5.0] * 2) == 3


def test_the_rates_judge_fails_a_key_over_its_rate():
    steady = rate_view_of([{"key": "a", "began": i * 0.2001} for i in range(400)])
    assert steady.most == {"a": 5} and abs(steady.per_minute["a"] - 5.0) < 0.1
    assert list(rates_held(Evidence2(steady))) == []  # type: ignore[arg-type]
    burst = rate_view_of([{"key": "a", "began": i * 0.05} for i in range(20)])
    (over,) = rates_held(Evidence2(burst))  # type: ignore[arg-type]
    assert over.valid is False and "a: 20" in over.message
    (idle,) = rates_held(Evidence2(rate_view_of([{"key": "a", "began": 0.0}])))  # type: ignore[arg-type]
    assert idle.valid == "unknown"


class Evidence2:
    def __init__(self, rates):
        self.rates = rates
