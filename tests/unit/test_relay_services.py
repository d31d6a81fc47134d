"""The relay's services without servers: the one loop they all run (``run_passes``) on Trio's
MockClock, so every wait is exact; the reaper's decision as a pure function; each service's
``run_once`` against stand-ins for the database, Kafka and the lag probe (the real statements
are driven in tests/integration/test_store.py)."""

from __future__ import annotations

import json
import logging
import random
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
import pytest
import trio

from leasework import metrics, store, wakegate
from leasework.config import load
from leasework.health import measure_event_loop_lag
from leasework.job import Job
from leasework.kafka import PublishResult
from leasework.outcomes import Completion, Outcome
from leasework.relay import lag, outbox
from leasework.relay.backlog import BacklogGauge
from leasework.relay.outbox import OutboxConfig, OutboxRelay, Published, slow_pass
from leasework.relay.promoter import Promoted, Promoter, PromoterConfig
from leasework.relay.pruner import Pruner, PrunerConfig, Retention
from leasework.relay.reaper import Reaper, ReaperConfig, expired_outcome, expired_outcomes
from leasework.relay.service import Backoff, Pass, Setback, run_passes
from leasework.service import Stopping
from leasework.states import IllegalTransition, Status
from leasework.store.relay import OutboxBatch, OutboxMessage

# ---------------------------------------------------------------- the loop


@dataclass(frozen=True)
class Did(Pass):
    """A pass as a test scripts it."""

    more: bool = False
    trouble: Setback | None = None

    @property
    def more_waiting(self) -> bool:
        return self.more

    @property
    def setback(self) -> Setback | None:
        return self.trouble


class Script:
    """A ``run_once`` that plays ``steps`` (a Pass to return, an exception to raise), noting
    the (mock) time of each call; once they are played it ends the loop by cancelling it."""

    def __init__(self, *steps: Pass | Exception) -> None:
        self.steps = list(steps)
        self.calls: list[float] = []
        self.scope = trio.CancelScope()

    async def __call__(self) -> Pass:
        self.calls.append(trio.current_time())
        if not self.steps:
            self.scope.cancel()
            await trio.sleep_forever()
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def waits(self) -> list[float]:
        return [round(b - a, 6) for a, b in zip(self.calls, self.calls[1:], strict=False)]


BACKOFF = Backoff(0.2, 5.0)
INTERVAL = 1.0


async def drive(script: Script, **options) -> list[float]:
    """Run the loop over ``script`` until it is played out; the waits between its passes."""
    options = {"interval": INTERVAL, "backoff": BACKOFF, **options}
    with trio.fail_after(3600), script.scope:  # a loop that swallowed the cancel fails here
        await run_passes("test", script, **options)
    return script.waits()


def down() -> psycopg.Error:
    return psycopg.OperationalError("connection refused")


async def test_the_backoff_doubles_with_each_failure_in_a_row_up_to_its_cap(autojump_clock):
    waits = await drive(Script(*(down() for _ in range(8))))
    assert waits == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]


async def test_a_pass_that_succeeds_resets_the_backoff(autojump_clock):
    waits = await drive(Script(down(), down(), Did(), down(), down()))
    assert waits == [0.2, 0.4, INTERVAL, 0.2, 0.4]


async def test_more_waiting_runs_the_next_pass_at_once_and_an_idle_one_waits_the_interval(
    autojump_clock,
):
    waits = await drive(Script(Did(more=True), Did(more=True), Did(), Did(more=True), Did()))
    assert waits == [0.0, 0.0, INTERVAL, 0.0, INTERVAL]


async def test_an_idle_service_waits_its_own_way_when_it_has_one(autojump_clock):
    woken = []

    async def until_notified() -> None:
        woken.append(trio.current_time())
        await trio.sleep(0.3)

    waits = await drive(Script(Did(), Did(more=True), Did()), idle=until_notified)
    assert waits == [0.3, 0.0, 0.3] and len(woken) == 2  # not after the full batch


async def test_a_failing_pass_does_not_end_the_loop_and_is_logged_once_as_what_it_is(
    autojump_clock, caplog
):
    script = Script(RuntimeError("a bug"), down(), KeyError("weather here"), Did())
    with caplog.at_level(logging.WARNING, logger="leasework.relay.service"):
        waits = await drive(script, expected=(psycopg.Error, KeyError))
    assert waits == [0.2, 0.4, 0.8, INTERVAL]  # every pass ran, the last one succeeded
    bug, database, expected = caplog.records
    assert bug.levelno == logging.ERROR and bug.exc_info is not None
    assert bug.getMessage() == "test pass failed unexpectedly (a bug); retrying"
    assert database.levelno == logging.WARNING and database.exc_info is None
    assert database.getMessage() == "test pass failed"
    assert database.error == "connection refused"
    assert expected.levelno == logging.WARNING and expected.getMessage() == "test pass failed"


async def test_a_setback_backs_off_as_a_failure_does_and_says_why(autojump_clock, caplog):
    trouble = Setback("kafka did not acknowledge outbox rows; kept for retry", {"failed": 2})
    script = Script(Did(trouble=trouble), Did(trouble=trouble), Did(), Did(trouble=trouble))
    with caplog.at_level(logging.WARNING, logger="leasework.relay.service"):
        waits = await drive(script)
    assert waits == [0.2, 0.4, INTERVAL, 0.2]
    assert [(r.getMessage(), r.failed, r.backoff) for r in caplog.records] == [
        (trouble.message, 2, 0.2),
        (trouble.message, 2, 0.4),
        (trouble.message, 2, 0.2),
    ]


def test_a_backoff_starts_at_the_interval_and_is_never_shorter_than_it():
    assert Backoff.from_interval(0.5) == Backoff(0.5, 5.0)
    assert Backoff.from_interval(60.0) == Backoff(60.0, 60.0)  # the pruner's: its interval
    assert Backoff(1.0, 5.0).after(0.0) == 1.0 and Backoff(1.0, 5.0).after(4.0) == 5.0
    with pytest.raises(ValueError):
        Backoff(2.0, 1.0)
    with pytest.raises(ValueError):
        Backoff(0.0, 1.0)


# ---------------------------------------------------------------- the reaper's decision

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def expired_job(**fields) -> Job:
    values = {
        "id": uuid.uuid4(),
        "type": "noop",
        "payload": {},
        "status": Status.RUNNING,
        "run_at": NOW,
        "attempt": 1,
        "max_attempts": 3,
        "timeout_seconds": 60,
        "fence": 7,
        "lease_owner": "worker-1",
        "lease_expires_at": NOW,
        "idempotency_key": None,
        "ordering_key": None,
        "last_error": None,
        "cancel_requested": False,
        "created_at": NOW,
        "updated_at": NOW,
        "started_at": NOW,
        "finished_at": None,
        "result": None,
        "retry_base": None,
        "retry_cap": None,
        "deferrals": 0,
        "attempt_budget": 3,
    }
    return Job(**{**values, **fields})


class Ceiling(random.Random):
    """Full jitter that always draws the top of its range: the delay is the backoff's bound."""

    def uniform(self, a: float, b: float) -> float:
        return b


SETTINGS = load("relay", {"LEASEWORK_RETRY_BASE": "1s", "LEASEWORK_RETRY_CAP": "2s"})
REAPER = ReaperConfig.from_settings(SETTINGS)


def test_an_expired_lease_fails_with_a_backoff_and_its_last_attempt_dies():
    retry, last = expired_job(attempt=3, max_attempts=5), expired_job(attempt=3, max_attempts=3)
    retried, died = expired_outcomes([retry, last], REAPER, Ceiling())
    # the settings' backoff: min(cap 2 s, base 1 s * 2 ** (3 - 1))
    assert retried == Completion(
        retry.id, 7, Outcome(Status.FAILED, "lease of worker-1 expired (fence 7)", 2.0)
    )
    assert died == Completion(
        last.id, 7, Outcome(Status.DEAD, "lease of worker-1 expired (fence 7)", None)
    )


def test_a_jobs_own_backoff_wins_over_the_settings():
    job = expired_job(attempt=2, retry_base=3.0, retry_cap=100.0, fence=12, lease_owner="w-2")
    decided = expired_outcome(job, REAPER, Ceiling())
    assert decided.outcome.retry_in == 6.0  # 3 s * 2 ** (2 - 1), under its own cap
    assert decided.fence == 12 and decided.outcome.error == "lease of w-2 expired (fence 12)"
    jittered = expired_outcome(job, REAPER, random.Random(17))
    assert 0.0 <= jittered.outcome.retry_in <= 6.0


def test_only_a_running_job_can_have_its_lease_expire():
    with pytest.raises(IllegalTransition):
        expired_outcome(expired_job(status=Status.QUEUED), REAPER)


def test_the_reapers_config_comes_from_the_settings():
    assert (REAPER.dlq_topic, REAPER.retry_base, REAPER.retry_cap) == ("jobs.dlq", 1.0, 2.0)
    assert (REAPER.batch, REAPER.interval) == (200, 1.0)


# ---------------------------------------------------------------- each service's pass


class Db:
    """A Database whose calls run ``fn`` on no connection (the statements are stand-ins)."""

    async def run(self, fn, *args, abandon_on_cancel=False):
        return fn(None, *args)


async def test_a_reaper_pass_counts_and_logs_only_the_jobs_it_wrote(monkeypatch, caplog):
    taken, lost, doomed = (
        expired_job(),
        expired_job(),
        expired_job(attempt=3, max_attempts=3),
    )
    written: list[list[Completion]] = []

    def reap_many(conn, reaped, *, dlq_topic):
        written.append(reaped)
        assert dlq_topic == "jobs.dlq"
        return {c.job_id: c.outcome.status for c in reaped if c.job_id != lost.id}

    monkeypatch.setattr(store, "jobs_expired", lambda conn, limit: [taken, lost, doomed])
    monkeypatch.setattr(store, "jobs_reap_many", reap_many)
    before = metrics.lease_expirations._value.get()
    with caplog.at_level(logging.WARNING, logger="leasework.relay.reaper"):
        done = await Reaper(Db(), REAPER).run_once()  # type: ignore[arg-type]
    assert (done.failed, done.dead) == (1, 1) and not done.more_waiting
    assert [c.job_id for c in written[0]] == [taken.id, lost.id, doomed.id]  # one write
    assert metrics.lease_expirations._value.get() - before == 2
    assert [(r.getMessage(), r.job_id, r.status) for r in caplog.records] == [
        ("lease expired; job requeued", str(taken.id), "failed"),
        ("lease expired; job requeued", str(doomed.id), "dead"),
    ]


class Kafka:
    """A publisher whose deliveries fail for the keys in ``refusing``."""

    def __init__(self) -> None:
        self.refusing: set[str] = set()

    def partitions(self, topics):
        return {}  # metadata unknown: every message goes by its key

    def renew_if_recreated(self, topics):
        return []  # no topic was made again

    def publish(self, messages, timeout, partitions=None):
        return [
            PublishResult(False, "broker down") if key in self.refusing else PublishResult(True)
            for _topic, key, _value, _headers in messages
        ]


def message(n: int) -> OutboxMessage:
    return OutboxMessage(n, "jobs.ready", f"k{n}", "{}", {})


class Outbox:
    """The outbox statements, on a list of rows."""

    def __init__(self, monkeypatch, rows: list[OutboxMessage]) -> None:
        self.rows = rows
        monkeypatch.setattr(store, "outbox_fetch", self.fetch)
        monkeypatch.setattr(store, "outbox_retire", self.retire)

    def fetch(self, conn, limit):
        return OutboxBatch(self.rows[:limit], len(self.rows) >= limit)  # one topic

    def retire(self, conn, ids):
        self.rows = [m for m in self.rows if m.id not in ids]


async def test_an_outbox_pass_deletes_what_kafka_acknowledged_and_says_when_it_did_not(
    monkeypatch,
):
    rows = Outbox(monkeypatch, [message(1), message(2), message(3)])
    kafka, conditions = Kafka(), {"other": "kept"}
    kafka.refusing = {"k2"}
    relay = OutboxRelay(Db(), kafka, OutboxConfig(batch=10), conditions)  # type: ignore[arg-type]
    published = metrics.relay_published._value.get()
    failures = metrics.relay_publish_failures._value.get()
    done = await relay.run_once()
    assert done == Published(2, 1, "broker down", False) and not done.more_waiting
    assert done.setback == Setback(
        "kafka did not acknowledge outbox rows; kept for retry",
        {"failed": 1, "error": "broker down"},
    )
    assert [m.id for m in rows.rows] == [2]  # kept for the next pass
    assert conditions == {"other": "kept", "outbox-relay": "cannot publish to kafka: broker down"}
    assert metrics.relay_published._value.get() - published == 2
    assert metrics.relay_publish_failures._value.get() - failures == 1
    kafka.refusing = set()
    done = await relay.run_once()
    assert done == Published(1, 0, None, False) and done.setback is None
    assert rows.rows == [] and conditions == {"other": "kept"}


async def test_an_outbox_pass_in_flight_at_a_stop_runs_until_the_deadline_then_is_abandoned(
    autojump_clock, caplog
):
    """The relay cancels its services at a stop; a pass whose publish waits on Kafka goes on
    until the shutdown's deadline, where its thread is abandoned (it was waited for: a
    `leasework dev` with a 1 s timeout stopped 14.9 s after SIGINT), and says so."""
    stopping, calls = Stopping(), []

    class Unanswered(Db):
        async def run(self, fn, *args, abandon_on_cancel=False):
            calls.append(abandon_on_cancel)
            await trio.sleep(15)  # the producer's message timeout
            return Published(1, 0, None, False)

    relay = OutboxRelay(Unanswered(), Kafka(), OutboxConfig(), {}, stopping)  # type: ignore[arg-type]
    caplog.set_level(logging.WARNING, "leasework.relay.outbox")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay.run)
        await trio.sleep(1)
        stopping.set("SIGINT", trio.current_time() + 1)
        nursery.cancel_scope.cancel()
    assert trio.current_time() == 2.0  # the deadline, not the publish's 16
    assert calls == [True]
    assert [r.getMessage() for r in caplog.records] == [
        "outbox pass abandoned at the shutdown deadline (kafka did not acknowledge in time); "
        "its rows stay in the outbox for the next relay"
    ]


async def test_the_outbox_relay_backs_off_runs_full_batches_at_once_and_paces_after_a_notify(
    monkeypatch, autojump_clock
):
    rows = Outbox(monkeypatch, [message(n) for n in range(1, 6)])
    kafka = Kafka()
    kafka.refusing = {"k1"}
    passes: list[tuple[float, int]] = []  # (when, rows waiting)
    stop = trio.CancelScope()

    class Watched(Db):
        async def run(self, fn, *args, **kwargs):
            passes.append((trio.current_time(), len(rows.rows)))
            if len(passes) == 2:
                kafka.refusing = set()
            if len(passes) == 7:
                stop.cancel()
            return await super().run(fn, *args)

    notifies = [
        0.01,
        0.1,
        0.1,
    ]  # seconds into each wait a NOTIFY comes (the stop lands in the third)

    async def notified(self, at_most: float) -> list[str]:
        await trio.sleep(notifies.pop(0))
        return [""]

    monkeypatch.setattr(outbox.Listener, "wait", notified)
    gate = Gate(monkeypatch)
    config = OutboxConfig(batch=2, tick=0.5)
    with trio.fail_after(60), stop:
        await OutboxRelay(Watched(), kafka, config, {}).run()  # type: ignore[arg-type]
    start = passes[0][0]
    assert [(round(t - start, 6), waiting) for t, waiting in passes] == [
        (0.0, 5),  # k1 refused, k2 published: back off
        (0.2, 4),  # k1, k3 published: a full batch
        (0.2, 2),  # at once: k4, k5, a full batch
        (0.2, 0),  # at once: nothing left, so the relay arms its gate
        (0.2, 0),  # and looks once more before it waits for a NOTIFY
        (0.225, 0),  # one at 0.21: rows gather for the rest of the window after the last produce
        (0.325, 0),  # one at 0.325, a window after the last produce: published at once
    ]
    # armed once, when a pass first found nothing; disarmed by none (the passes that
    # published came before it armed, and it stays armed while passes find nothing)
    assert [(round(t - start, 6), what) for t, what in gate.log] == [(0.2, "arm")]


class Gate:
    """The relay gate's arm and disarm, logged; ``refusals`` arms fail first (a stripe an open
    transaction holds)."""

    def __init__(self, monkeypatch, refusals: int = 0) -> None:
        self.log: list[tuple[float, str]] = []
        self.refusals = refusals
        gate = self

        async def arm(listener) -> bool:
            gate.log.append((trio.current_time(), "arm"))
            stripes = set(wakegate.all_stripes())
            if gate.refusals:
                gate.refusals -= 1
                stripes.discard(0)
            listener.held = stripes
            return listener.armed

        async def disarm(listener) -> None:
            if listener.held:
                gate.log.append((trio.current_time(), "disarm"))
            listener.held = set()

        monkeypatch.setattr(outbox.Listener, "arm", arm)
        monkeypatch.setattr(outbox.Listener, "disarm", disarm)


async def test_a_relay_that_cannot_arm_tries_again_every_poll_and_looks_once_it_has(
    monkeypatch, autojump_clock
):
    """A transaction that sent no NOTIFY holds a stripe: the relay listens (other stripes'
    NOTIFYs still wake it), tries again every POLL, and passes once it holds every stripe, so
    that transaction's rows, visible now, go out; then it waits for a NOTIFY or its tick."""
    rows = Outbox(monkeypatch, [])
    passes: list[float] = []
    waits: list[float] = []
    stop = trio.CancelScope()

    class Watched(Db):
        async def run(self, fn, *args, **kwargs):
            passes.append(trio.current_time())
            if len(passes) == 3:
                stop.cancel()
            return await super().run(fn, *args)

    async def silent(self, at_most: float) -> list[str]:
        waits.append(at_most)
        await trio.sleep(at_most)
        return []

    monkeypatch.setattr(outbox.Listener, "wait", silent)
    gate = Gate(monkeypatch, refusals=3)
    with trio.fail_after(60), stop:
        await OutboxRelay(Watched(), Kafka(), OutboxConfig(tick=0.5), {}).run()  # type: ignore[arg-type]
    start = passes[0]
    assert [round(t - start, 6) for t in passes] == [0.0, 0.15, 0.65]
    assert [round(w, 6) for w in waits[:4]] == [outbox.POLL] * 3 + [0.5]
    assert [what for _, what in gate.log] == ["arm"] * 4 and rows.rows == []


async def test_a_promoter_pass_is_a_full_batch_or_the_relay_waits(monkeypatch):
    due = [3]
    monkeypatch.setattr(store, "jobs_promote_due", lambda conn, limit, topic: due[0])
    # and each pass releases what concurrency limits held (as many as have room)
    monkeypatch.setattr(store, "jobs_release_limited", lambda conn, limit, topic: 1)
    promoter = Promoter(Db(), PromoterConfig("jobs.ready", batch=3))  # type: ignore[arg-type]
    before = metrics.promoted._value.get(), metrics.limit_released._value.get()
    assert await promoter.run_once() == Promoted(3, 3) and Promoted(3, 3).more_waiting
    due[0] = 2
    assert not (await promoter.run_once()).more_waiting
    assert metrics.promoted._value.get() - before[0] == 5
    assert metrics.limit_released._value.get() - before[1] == 2
    tick = PromoterConfig.from_settings(load("relay", {"LEASEWORK_RELAY_TICK": "250ms"}))
    assert (tick.interval, tick.backoff) == (0.25, Backoff(0.25, 5.0))


async def test_a_prune_pass_drains_each_retention_in_batches_and_leaves_the_outbox_alone():
    calls: list[tuple] = []
    answers = {"succeeded": [2, 2, 1], "audit_log": [0], "invariant_violations": [1]}

    class Deleting:
        async def run(self, fn, *args):
            calls.append((fn.__name__, *map(str, args)))
            return answers[str(args[0])].pop(0)

    retention = Retention(succeeded=10.0, dead=None, cancelled=None, audit=20.0)
    counts = await Pruner(Deleting(), PrunerConfig(retention, batch=2)).run_once()  # type: ignore[arg-type]
    assert counts.jobs == {Status.SUCCEEDED: 5}
    assert counts.tables == {"audit_log": 0, "invariant_violations": 1}  # the audit's retention
    assert calls == [("jobs_prune", "succeeded", "10.0", "2")] * 3 + [
        ("rows_prune", "audit_log", "20.0", "2"),
        ("rows_prune", "invariant_violations", "20.0", "2"),
    ]
    assert not counts.more_waiting  # a pass drains what is past its retention
    assert "outbox" not in Retention.from_settings(SETTINGS).of_tables()
    with pytest.raises(TypeError):
        Retention(1.0, 2.0, 3.0)  # type: ignore[misc]  # by name only: no field can shift


async def test_the_backlog_gauge_keeps_its_last_values_while_postgres_cannot_be_asked(
    monkeypatch,
):
    answer: list = [(4, 1.5)]

    def pending(conn):
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]

    monkeypatch.setattr(store, "outbox_pending", pending)
    gauge = BacklogGauge(Db())  # type: ignore[arg-type]
    sample = await gauge.run_once()
    assert (sample.pending, sample.oldest_age) == (4, 1.5)
    assert metrics.outbox_pending._value.get() == 4
    answer[0] = down()
    sample = await gauge.run_once()  # no exception, nothing for the loop to log
    assert (sample.pending, sample.oldest_age) == (None, None)
    assert (
        metrics.outbox_pending._value.get() == 4 and metrics.outbox_oldest_age._value.get() == 1.5
    )


def lag_line(lag: list, unread: list | None = None) -> str:
    return json.dumps({"lag": lag, "unread": unread or []})


def exported_lag() -> dict[tuple[str, str, str], float]:
    return {
        labels: metrics.consumer_lag.labels(*labels)._value.get()
        for labels in lag.exported_lag_labels()
    }


async def test_the_lag_probe_exports_each_sample_it_prints_until_it_exits():
    for labels in lag.exported_lag_labels():
        metrics.consumer_lag.remove(*labels)
    lines = [
        lag_line([["default", 0, 0, 3], ["default", 0, 1, 0], ["emails", 2, 0, 5]]),
        '{"error": "coordinator unavailable"}',
        "noise",
        lag_line([["default", 0, 0, 7], ["default", 0, 1, 0], ["emails", 2, 0, 4]]),
    ]
    script = "".join(f"print({line!r})\n" for line in lines)
    run = await lag.read_lag_samples([sys.executable, "-c", script])
    assert (run.samples, run.returncode) == (2, 0) and not run.more_waiting
    assert exported_lag() == {
        ("default", "0", "0"): 7,
        ("default", "0", "1"): 0,
        ("emails", "2", "0"): 4,
    }


def test_a_band_gone_from_a_sample_is_no_longer_exported_unless_it_was_unread():
    for labels in lag.exported_lag_labels():
        metrics.consumer_lag.remove(*labels)
    first = [["default", 0, 0, 1], ["emails", 1, 0, 2], ["scratch", 3, 0, 9]]
    assert lag.export_lag_sample(lag_line(first).encode())
    # emails' band 1 could not be read this time: its last value stands; scratch was deleted
    assert lag.export_lag_sample(lag_line([["default", 0, 0, 0]], [["emails", 1]]).encode())
    assert exported_lag() == {("default", "0", "0"): 0, ("emails", "1", "0"): 2}
    assert lag.export_lag_sample(b'{"lag": [["default", 0, 0, "x"], [1, 2], 3], "unread": [4]}')
    assert exported_lag() == {}


async def test_a_lag_probe_that_cannot_start_is_logged_and_waited_for(monkeypatch, caplog):
    config = lag.LagConfig(("a:1", "b:2"), "group", "jobs.ready", every=5.0)
    assert config.command()[1:] == ["-m", "leasework.relay.lagprobe", "a:1,b:2", "group"] + [
        "jobs.ready",
        "5.0",
    ]
    monkeypatch.setattr(lag.LagConfig, "command", lambda self: ["/nonexistent/lagprobe"])
    with caplog.at_level(logging.WARNING, logger="leasework.relay.lag"):
        run = await lag.ConsumerLag(config).run_once()
    assert (run.samples, run.returncode) == (0, None)
    assert [r.getMessage() for r in caplog.records] == ["consumer lag probe could not run"]


# --- a slow outbox pass says where its time went ----------------------------------------


def test_a_pass_under_the_threshold_is_not_reported():
    marks = {"connected": 10.01, "fetched": 10.02, "published": 10.3, "retired": 10.31}
    assert slow_pass(10.0, marks, 10.4, threshold=0.5) is None


def test_a_slow_pass_is_split_into_its_steps():
    marks = {"connected": 10.7, "fetched": 10.75, "published": 11.05, "retired": 11.1}
    assert slow_pass(10.0, marks, 11.2, threshold=0.5) == {
        "waited_for_connection_s": 0.7,
        "fetch_s": 0.05,
        "publish_s": 0.3,
        "retire_s": 0.05,
        "commit_s": 0.1,
        "total_s": 1.2,
    }


def test_a_slow_pass_that_found_nothing_has_only_its_first_steps():
    split = slow_pass(10.0, {"connected": 10.1, "fetched": 10.9}, 11.0, threshold=0.5)
    assert split == {
        "waited_for_connection_s": 0.1,
        "fetch_s": 0.8,
        "commit_s": 0.1,
        "total_s": 1.0,
    }


# --- a blocked event loop is logged ---------------------------------------------------------


async def test_a_blocked_event_loop_is_logged_and_a_short_lag_is_not(caplog):
    caplog.set_level(logging.WARNING, logger="leasework.health")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(measure_event_loop_lag, 0.01, 0.2)
        await trio.sleep(0.05)
        time.sleep(0.05)  # noqa: ASYNC251 - blocks the loop on purpose, under the threshold
        await trio.sleep(0.05)
        assert not [r for r in caplog.records if r.msg.startswith("event loop blocked")]
        time.sleep(0.3)  # noqa: ASYNC251 - blocks the loop on purpose, over the threshold
        await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    blocked = [r for r in caplog.records if r.msg.startswith("event loop blocked")]
    assert len(blocked) == 1 and blocked[0].blocked_seconds >= 0.25
