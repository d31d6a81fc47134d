"""The run's unique load: concurrent inserters fighting over the same unique keys at every
door, with rollbacks, while the faults run; and the jobs that hold the keys, read at the end.

Each inserter loops for the workload's duration: it takes the keys of the current
generation (``<prefix>-u<generation>-<i>``, new ones each ``generation_seconds``), picks a
door and one key (two for ``batch`` and ``enqueue_many``, possibly the same one twice) and
inserts an ``echo`` job ``{"k": key}`` unique by ``k`` in every state, so a key may be held
by at most one job, ever:

- ``http``: ``POST /jobs``; ``batch``: ``POST /jobs/batch``; classified as the workload's
  submits are (:func:`chaos.workload.classify_response`): 2xx committed, a refusal failed,
  a lost answer unknown. Never retried: a retry is one more insert of the key, and the load
  makes plenty.
- ``enqueue``, ``enqueue_many`` (:mod:`leasework.enqueue`) and ``sql`` (``SELECT
  leasework_enqueue(..., unique_fields => ...)``): the harness's own transaction on the
  shared Postgres proxy (faults on it hit these doors too), held open up to
  ``hold_seconds`` after the insert so other inserters queue behind it on the index, then
  rolled back (with probability ``rollback``) or committed. An error before ``COMMIT`` wrote
  nothing (failed); an error from ``COMMIT`` is unknown.

Every item is one :class:`chaos.unique_keys.UniqueInsert`; :mod:`chaos.unique_keys` checks
them against the jobs. A database transaction runs in a worker thread (one hop per
transaction, a limiter of ``inserters``); psycopg's own timeouts bound it.

The unsafe load (``unsafe = true``) asks for no uniqueness: each insert first looks for a
job of its key and inserts one when it sees none (check-then-insert, with the same hold and
rollbacks), as an application would without the index; its keys must double.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import psycopg
import trio
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

import leasework
from chaos.scenario import UniqueSpec
from chaos.tables import like_escaped
from chaos.unique_keys import COMMITTED, FAILED, ROLLED_BACK, UNKNOWN_OUTCOME, UniqueInsert
from chaos.workload import classify_exception, classify_response
from devstack.layout import POSTGRES_DIRECT_DSN, POSTGRES_DSN
from leasework.states import Status
from leasework.tokens import auth_headers, default_token
from leasework.unique import Unique

JOB_TYPE = "echo"
FIELD = "k"
STATES: tuple[str, ...] = tuple(s.value for s in Status)  # held in every state: one job, ever
UNIQUE = Unique(fields=(FIELD,), states=frozenset(Status))
UNIQUE_BODY: dict[str, Any] = {"fields": [FIELD], "states": list(STATES)}
STATEMENT_TIMEOUT_MS = 10_000
CONNECT_TIMEOUT = 3
FAULT_PAUSE = 0.2  # an inserter whose whole insert failed waits this long before the next

# one item's answer: (job id, duplicate or None when the door does not say)
Answer = tuple[str | None, bool | None]
_OUTCOME = {"ok": COMMITTED, "fail": FAILED, "info": UNKNOWN_OUTCOME}


def key_pattern(prefix: str) -> str:
    """The LIKE pattern of the run's unique keys."""
    return f"{like_escaped(prefix)}-u%"


def read_unique_jobs(prefix: str) -> list[dict[str, Any]]:
    """The jobs holding the run's keys (blocking; the direct port, never the proxy)."""
    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT id::text AS id, payload->>'k' AS key, status FROM jobs "
            "WHERE type = %s AND payload->>'k' LIKE %s ORDER BY created_at, id",
            (JOB_TYPE, key_pattern(prefix)),
        ).fetchall()


def _existing(conn: psycopg.Connection[Any], key: str) -> str | None:
    """The unsafe load's check: a job of the key this transaction can see, if any."""
    row = conn.execute(
        "SELECT id::text FROM jobs WHERE type = %s AND payload->>'k' = %s LIMIT 1",
        (JOB_TYPE, key),
    ).fetchone()
    return None if row is None else str(row[0])


def _insert(
    conn: psycopg.Connection[Any], door: str, keys: Sequence[str], unsafe: bool
) -> list[Answer]:
    """The items' inserts on ``conn``, in its open transaction."""
    if unsafe:
        answers: list[Answer] = []
        for key in keys:
            if (held := _existing(conn, key)) is not None:
                answers.append((held, True))
            else:
                answers.append((str(leasework.enqueue(conn, JOB_TYPE, {FIELD: key})), False))
        return answers
    if door == "enqueue":
        job = leasework.enqueue(conn, JOB_TYPE, {FIELD: keys[0]}, unique=UNIQUE)
        return [(str(job), job.duplicate)]
    if door == "enqueue_many":
        jobs = leasework.enqueue_many(
            conn, [leasework.job(JOB_TYPE, {FIELD: key}, unique=UNIQUE) for key in keys]
        )
        return [(str(job), job.duplicate) for job in jobs]
    if door == "sql":
        row = conn.execute(
            "SELECT leasework_enqueue(%s, %s, unique_fields => %s, unique_states => %s)",
            (JOB_TYPE, Jsonb({FIELD: keys[0]}), [FIELD], list(STATES)),
        ).fetchone()
        return [(None if row is None else str(row[0]), None)]
    raise ValueError(f"{door!r} is not a door of the harness's own transactions")


def run_transaction(
    door: str, keys: Sequence[str], *, rollback: bool, hold: float, unsafe: bool
) -> tuple[str, list[Answer], str | None]:
    """One insert in a transaction of the harness's own (blocking): the outcome, the items'
    answers and the error, if any."""
    nothing: list[Answer] = [(None, None)] * len(keys)
    try:
        conn = psycopg.connect(
            POSTGRES_DSN,
            connect_timeout=CONNECT_TIMEOUT,
            options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
        )
    except psycopg.Error as exc:
        return FAILED, nothing, _text(exc)
    try:
        try:
            answers = _insert(conn, door, keys, unsafe)
            if hold > 0:
                time.sleep(hold)
        except (psycopg.Error, leasework.InvalidJob) as exc:  # nothing was committed
            return FAILED, nothing, _text(exc)
        if rollback:
            try:
                conn.rollback()
            except psycopg.Error:  # a dead connection rolls back by itself
                pass
            return ROLLED_BACK, answers, None
        try:
            conn.commit()
        except psycopg.Error as exc:  # the COMMIT may have landed, its answer lost
            return UNKNOWN_OUTCOME, answers, _text(exc)
        return COMMITTED, answers, None
    finally:
        conn.close()


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


class UniqueLoad:
    """The inserters of one run; :attr:`inserts` holds every item once they are done."""

    def __init__(
        self,
        spec: UniqueSpec,
        *,
        prefix: str,
        duration: float,
        now: Callable[[], float],
        seed: int,
        base_url: str,
    ) -> None:
        self.spec, self.prefix, self.duration, self.now = spec, prefix, duration, now
        self.seed, self.base_url = seed, base_url
        self.inserts: list[UniqueInsert] = []
        self.limiter = trio.CapacityLimiter(spec.inserters)

    def key(self, generation: int, index: int) -> str:
        return f"{self.prefix}-u{generation:05d}-{index}"

    async def run(self) -> None:
        timeout = httpx.Timeout(self.spec.timeout)
        limits = httpx.Limits(max_connections=self.spec.inserters)
        async with (
            httpx.AsyncClient(
                base_url=self.base_url,
                timeout=timeout,
                limits=limits,
                headers=auth_headers(default_token()),
            ) as http,
            trio.open_nursery() as nursery,
        ):
            for number in range(self.spec.inserters):
                nursery.start_soon(self._inserter, number, http)

    async def _inserter(self, number: int, http: httpx.AsyncClient) -> None:
        rng = random.Random(self.seed * 1_000 + number)
        spec = self.spec
        while (started := self.now()) < self.duration:
            generation = int(started / spec.generation_seconds)
            keys = [self.key(generation, i) for i in range(spec.keys)]
            door = rng.choice(spec.doors)
            items = 2 if door in ("batch", "enqueue_many") else 1
            chosen = [rng.choice(keys) for _ in range(items)]
            rollback = rng.random() < spec.rollback
            hold = rng.uniform(0.0, spec.hold_seconds)
            if door in ("http", "batch"):
                outcome, answers, error = await self._http(http, door, chosen)
            else:
                transaction = functools.partial(
                    run_transaction, door, chosen, rollback=rollback, hold=hold, unsafe=spec.unsafe
                )
                outcome, answers, error = await trio.to_thread.run_sync(
                    transaction, limiter=self.limiter
                )
            ended = self.now()
            for key, (job_id, duplicate) in zip(chosen, answers, strict=True):
                self.inserts.append(
                    UniqueInsert(key, door, outcome, job_id, duplicate, started, ended, error)
                )
            if outcome == FAILED:
                await trio.sleep(FAULT_PAUSE)

    async def _http(
        self, http: httpx.AsyncClient, door: str, keys: Sequence[str]
    ) -> tuple[str, list[Answer], str | None]:
        """One ``POST /jobs`` or ``/jobs/batch``; the unsafe load checks for the key first
        (on the direct port) and sends no ``unique``."""
        held: list[str | None] = [None] * len(keys)
        if self.spec.unsafe:
            try:
                held = [
                    await trio.to_thread.run_sync(_seen, key, limiter=self.limiter) for key in keys
                ]
            except psycopg.Error as exc:  # nothing was sent
                return FAILED, [(None, None)] * len(keys), _text(exc)
        send = [key for key, h in zip(keys, held, strict=True) if h is None]
        if not send:
            return COMMITTED, [(h, True) for h in held], None
        outcome, sent, error = await self._post(http, door, send)
        answers = iter(sent)
        return outcome, [(h, True) if h else next(answers) for h in held], error

    async def _post(
        self, http: httpx.AsyncClient, door: str, keys: Sequence[str]
    ) -> tuple[str, list[Answer], str | None]:
        nothing: list[Answer] = [(None, None)] * len(keys)
        items = [self._body(key) for key in keys]
        if door == "http" or len(items) == 1:
            path, body = "/jobs", items[0]
        else:
            path, body = "/jobs/batch", {"jobs": items}
        with trio.move_on_after(self.spec.timeout + 1.0):
            try:
                response = await http.post(path, json=body)
            except httpx.HTTPError as exc:
                classified = classify_exception(exc)
                return _OUTCOME[classified.type], nothing, classified.error
            classified = classify_response(response)
            if classified.type != "ok":
                return _OUTCOME[classified.type], nothing, classified.error
            try:
                data = response.json()
                views = [data] if path == "/jobs" else data["jobs"]
                answers: list[Answer] = [(v["id"], bool(v.get("duplicate"))) for v in views]
            except (ValueError, KeyError, TypeError):  # committed, but the answer says not what
                return UNKNOWN_OUTCOME, nothing, f"a {response.status_code} without job ids"
            return COMMITTED, answers, None
        return UNKNOWN_OUTCOME, nothing, "no answer within the harness deadline"

    def _body(self, key: str) -> dict[str, Any]:
        body: dict[str, Any] = {"type": JOB_TYPE, "payload": {FIELD: key}}
        if not self.spec.unsafe:
            body["unique"] = UNIQUE_BODY
        return body


def _seen(key: str) -> str | None:
    """The unsafe load's check before an HTTP insert (blocking)."""
    with psycopg.connect(
        POSTGRES_DIRECT_DSN, autocommit=True, connect_timeout=CONNECT_TIMEOUT
    ) as conn:
        return _existing(conn, key)
