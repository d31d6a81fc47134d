"""Rate limits' pure parts: what a rate says, a job's limit key, and the reservation rule
(GCRA with a reservation; the Redis script applies the same)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from leasework.app import App, AppError
from leasework.job import Job
from leasework.ratelimit import Reservation
from leasework.rates import Rate, limit_key, parse_rate, reserve
from leasework.states import Status
from leasework.worker.claim import Claimer, ClaimResult, Skip
from tests.unit.test_relay_services import expired_job


def test_a_rate_is_starts_per_second_minute_or_hour():
    assert parse_rate("10/s") == Rate(10, 1.0)
    assert parse_rate(" 100 / m ", burst=5, key="customer") == Rate(100, 60.0, 5, "customer")
    assert parse_rate("5/10s") == Rate(5, 10.0) and parse_rate("1/h").interval_ms == 3_600_000
    assert parse_rate("3/s").interval_ms == 334  # rounded up: never faster than asked
    assert str(parse_rate("10/s", burst=3)) == "10/s (burst 3)"
    for bad in ("10", "10/d", "0/s", "ten/s", "10/0s", 10, None):
        with pytest.raises(ValueError, match="rate"):
            parse_rate(bad)
    with pytest.raises(ValueError, match="burst"):
        parse_rate("10/s", burst=0)


def test_a_jobs_limit_key_is_its_type_and_its_key_fields_text():
    per_customer = parse_rate("1/s", key="customer")
    assert limit_key("charge", {"customer": "c1"}, per_customer) == "charge/c1"
    assert limit_key("charge", {"customer": 7}, per_customer) == "charge/7"
    assert limit_key("charge", {}, per_customer) == "charge/"
    assert limit_key("charge", [1], per_customer) == "charge/"
    assert limit_key("charge", {"customer": "c1"}, parse_rate("1/s")) == "charge"


def starts(rate: Rate, arrivals: list[int], tat: int | None = None, floor: int | None = None):
    out = []
    for now in arrivals:
        start, tat = reserve(tat, now, rate, floor)
        out.append(start)
    return out, tat


def test_a_limit_starts_empty_then_one_per_interval_and_reserves_ahead():
    rate = parse_rate("10/s")  # 100 ms
    got, _ = starts(rate, [0, 0, 0, 0])
    assert got == [0, 100, 200, 300]  # no burst from nothing; each gets the next slot


def test_a_burst_is_there_after_a_quiet_spell_and_only_then():
    rate = parse_rate("10/s", burst=3)
    _, tat = starts(rate, [0])  # (from an empty state: 0, then tat = 300)
    got, _ = starts(rate, [10_000] * 5, tat=tat)  # quiet long enough to refill
    assert got == [10_000, 10_000, 10_000, 10_100, 10_200]


def test_a_lost_state_starts_after_every_start_reserved_for_the_limit():
    rate = parse_rate("10/s", burst=5)
    got, tat = starts(rate, [0] * 10)  # slots to 900 reserved, kept in postgres
    assert got[-1] == 900
    # Redis wiped at 50: a fresh state with the latest reserved start as floor
    after, _ = starts(rate, [50, 50], tat=None, floor=900)
    assert after == [1000, 1100]  # nothing handed out twice, no burst


def test_over_any_window_the_starts_stay_within_the_rate_and_the_burst():
    rate = parse_rate("20/s", burst=4)  # 50 ms
    arrivals = sorted([0] * 30 + list(range(0, 5000, 7)) + [2500] * 40)
    got, _ = starts(rate, arrivals)
    for begin in range(0, 8000, 25):
        inside = [s for s in got if begin <= s < begin + 1000]
        assert len(inside) <= 20 + 4 - 1, begin


class Order(BaseModel):
    customer_id: str


def test_a_types_rate_is_checked_when_declared_and_registered_as_json():
    app = App(name="rates")

    @app.job(rate="5/s", rate_burst=2, rate_key="customer_id")
    async def charge(ctx, payload: Order) -> None: ...

    (row,) = app.registry_rows()
    assert row["rate"] == {"count": 5, "per": 1.0, "burst": 2, "key": "customer_id"}
    for bad, why in (
        ({"rate": "5/d"}, "is not N/s"),
        ({"rate": "5/s", "rate_burst": 0}, "burst"),
        ({"rate_key": "customer_id"}, "need rate="),
        ({"rate": "5/s", "rate_key": "nosuch"}, "not a field of its payload"),
    ):
        with pytest.raises(AppError, match=why):

            @App(name="bad").job(**bad)
            async def wrong(ctx, payload: Order) -> None: ...


def rated_job(slot: float | None = None) -> Job:
    at = None if slot is None else datetime.fromtimestamp(slot, UTC)
    return expired_job(type="rated", status=Status.QUEUED, rate_slot_at=at)


async def test_a_claim_starts_on_its_reserved_start_waits_if_early_and_reserves_anew_if_late():
    app = App(name="rated")

    @app.job(rate="5/s")
    async def rated(ctx) -> None: ...

    asked: list[int] = []

    class Rates:
        """Reserves every start 5 s from now (a backlog): written back to Postgres."""

        async def reserve(self, requests, floors):
            asked.append(len(requests))
            now = int(time.time() * 1000)
            return [Reservation(now + 5000, now) for _ in requests]

    written: list[list] = []

    class Db:
        async def run(self, fn, waits):
            written.append(waits)
            return [w[0] for w in waits]

    claimer = Claimer(
        Db(),
        None,
        app,
        name="w",
        ttl=10,
        retry_base=1,
        retry_cap=2,
        rates=Rates(),  # type: ignore[arg-type]
    )
    now = time.time()
    on_time, early, late, fresh, mine = (
        rated_job(now - 0.02),  # its start, give or take the claim's own latency
        rated_job(now + 0.5),  # due 0.75 s early: waits out the rest in memory
        rated_job(now - 2.0),  # held past its start (an outage): its slot is gone
        rated_job(),  # no reservation yet
        rated_job(),  # reserved by this worker, waited for in memory: now
    )
    jobs = {j.id: j for j in (on_time, early, late, fresh, mine)}
    outcome = ClaimResult()
    go = await claimer.wait_for_rates(list(jobs), jobs, outcome, {mine.id: now})
    assert go == [on_time.id, mine.id]
    assert set(outcome.later) == {early.id} and outcome.later[early.id] == pytest.approx(now + 0.5)
    assert asked == [2]  # the late one and the fresh one, in one call
    assert {w[0] for w in written[0]} == {late.id, fresh.id}
    assert outcome.skipped == {late.id: Skip.RATE, fresh.id: Skip.RATE}
