"""Enqueue inside the caller's own transaction: the transactional outbox, for applications.

::

    with psycopg.connect(dsn) as conn:
        order_id = conn.execute("INSERT INTO orders ... RETURNING id").fetchone()[0]
        leasework.enqueue(conn, "send_receipt", {"order_id": order_id}, app=app)
    # committed: the order and its receipt job exist together; rolled back: neither does

The job row and its outbox row are written by one statement on the caller's connection, in
whatever transaction it is in (on an autocommit connection, in a transaction of their own), so
the business row and the job commit or vanish together. Nothing is committed here. The id
returned is an :class:`Enqueued`, a ``uuid.UUID`` that also says whether it is a duplicate
(a job holding the same unique key: nothing was written) or a replay. With
``app`` the type and payload are checked against it first (and the type's policy applies);
without, the type must be registered in ``job_types`` (an api or worker of the app registers
it), exactly as for the SQL function ``leasework_enqueue``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from leasework.app import App
from leasework.doors import AsyncDoor, SyncDoor, async_door, sync_door
from leasework.errors import FieldError, IdempotencyConflict, InvalidJob, UnknownJobType
from leasework.jsonlimits import storable_errors
from leasework.store import Inserted
from leasework.submission import (
    MAX_BATCH,
    Defaults,
    JobRequest,
    delay_of,
    insert_row,
    request_errors,
)
from leasework.unique import Unique

TOPIC = "jobs.ready"
NO_DEFAULTS = Defaults()


class Enqueued(uuid.UUID):
    """The id of an enqueued job, a ``uuid.UUID`` (equal to, and used as, the plain id) that
    also says what became of the request: ``duplicate``, the job that holds the same unique
    key (nothing was written), or ``replay``, the earlier job of the same idempotency key."""

    __slots__ = ("duplicate", "replay")
    duplicate: bool
    replay: bool

    def __init__(self, job_id: uuid.UUID, *, duplicate: bool = False, replay: bool = False):
        super().__init__(int=job_id.int)
        object.__setattr__(self, "duplicate", duplicate)
        object.__setattr__(self, "replay", replay)

    @classmethod
    def of(cls, inserted: Inserted) -> Enqueued:
        return cls(inserted.id, duplicate=inserted.duplicate, replay=inserted.replay)

    @property
    def id(self) -> uuid.UUID:
        """The plain ``uuid.UUID``."""
        return uuid.UUID(int=self.int)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_enqueued, (self.int, self.duplicate, self.replay))

    def __repr__(self) -> str:
        flags = "".join(f", {f}=True" for f in ("duplicate", "replay") if getattr(self, f))
        return f"Enqueued('{self}'{flags})"


def _enqueued(value: int, duplicate: bool, replay: bool) -> Enqueued:
    return Enqueued(uuid.UUID(int=value), duplicate=duplicate, replay=replay)


def job(
    job_type: str,
    payload: Any = None,
    *,
    idempotency_key: str | None = None,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
    timeout_seconds: int | None = None,
    ordering_key: str | None = None,
    unique: Unique | None = None,
    queue: str | None = None,
    priority: int | None = None,
) -> JobRequest:
    """One job for :func:`enqueue_many`; the arguments are those of :func:`enqueue`."""
    return JobRequest(
        type=job_type,
        payload={} if payload is None else payload,
        run_at=run_at,
        delay_seconds=delay_of(delay),
        max_attempts=max_attempts,
        timeout_seconds=timeout_seconds,
        ordering_key=ordering_key,
        idempotency_key=idempotency_key,
        unique=unique,
        queue=queue,
        priority=priority,
    )


def _as_json(request: JobRequest, app: App | None) -> JobRequest | list[FieldError]:
    """Python payloads (a model instance, a dataclass, dates) as the JSON they will be."""
    job_type = app.get(request.type) if app is not None else None
    if job_type is None:
        return request
    try:
        payload = job_type.to_json(request.payload)
    except ValueError as exc:
        # say where, when the value itself is what the store cannot keep (too deep, NaN...)
        return storable_errors(request.payload) or [FieldError("payload", str(exc))]
    return JobRequest(**{**request.__dict__, "payload": payload})


def prepare(requests: Iterable[JobRequest], app: App | None) -> list[dict[str, Any]]:
    """Check every request (raising :class:`InvalidJob` with all errors, by index when there
    are several) and build the rows for ``leasework_jobs_insert``."""
    requests = list(requests)
    if not 1 <= len(requests) <= MAX_BATCH:
        raise InvalidJob([FieldError("jobs", f"give 1-{MAX_BATCH} jobs, got {len(requests)}")])
    rows, errors = [], []
    unknown = False
    for index, request in enumerate(requests):
        prefix = f"jobs[{index}]." if len(requests) > 1 else ""
        converted = _as_json(request, app)
        problems = converted if isinstance(converted, list) else request_errors(converted, app)
        if problems:
            unknown = unknown or any(p.message.startswith("unknown job type") for p in problems)
            errors.extend(FieldError(prefix + p.field, p.message) for p in problems)
            continue
        rows.append(insert_row(converted, app, NO_DEFAULTS))
    if errors:
        raise (UnknownJobType if unknown else InvalidJob)(errors)
    return rows


def _names(rows: list[dict[str, Any]]) -> list[str]:
    return sorted({row["type"] for row in rows})


def _unknown(missing: list[str]) -> None:
    """Without an app, the types must be registered: the rule of ``leasework_enqueue``."""
    if missing:
        raise UnknownJobType(
            [FieldError("type", f"unknown job type {name!r}") for name in missing],
            f"unknown job type(s) {', '.join(map(repr, missing))}: no api or worker registered "
            "them; pass app= to check against your app, or start a worker of that app once",
        )


# Types known registered, per database. ``job_types`` rows are only ever added or updated
# (an app registers its types at start; nothing deletes one), so a name seen registered
# stays registered: after the first enqueue of a type, the check costs no round trip.
_REGISTERED: dict[tuple[Any, ...], frozenset[str]] = {}


def _unseen(door: SyncDoor | AsyncDoor, rows: list[dict[str, Any]]) -> list[str]:
    """The rows' type names not yet seen registered in this door's database."""
    known = _REGISTERED.get(door.database(), frozenset())
    return [name for name in _names(rows) if name not in known]


def _seen(door: SyncDoor | AsyncDoor, names: list[str], missing: list[str]) -> None:
    found = [n for n in names if n not in missing]
    if found:
        where = door.database()
        _REGISTERED[where] = _REGISTERED.get(where, frozenset()) | frozenset(found)
    _unknown(missing)


def _unregistered(door: SyncDoor, rows: list[dict[str, Any]]) -> None:
    if names := _unseen(door, rows):
        _seen(door, names, door.unregistered(names))


async def _unregistered_async(door: AsyncDoor, rows: list[dict[str, Any]]) -> None:
    if names := _unseen(door, rows):
        _seen(door, names, await door.unregistered(names))


def _raise_conflicts(requests: list[JobRequest], inserted: list[Inserted]) -> None:
    for request, result in zip(requests, inserted, strict=True):
        if result.conflict:
            raise IdempotencyConflict(request.idempotency_key or "", result.id)


def enqueue_many(
    conn: Any,
    jobs: Iterable[JobRequest | Mapping[str, Any]],
    *,
    app: App | None = None,
    topic: str = TOPIC,
) -> list[Enqueued]:
    """Enqueue several jobs (from :func:`job`, or dicts of its arguments) in the caller's
    transaction, in one statement; all or none. ``conn``: a psycopg ``Connection``, or a
    SQLAlchemy ``Session`` or ``Connection`` (:mod:`leasework.doors`). Returns their ids in
    order (an earlier job's id for a replayed idempotency key). Raises :class:`InvalidJob`
    (every bad item, by index) or :class:`IdempotencyConflict`, having written nothing."""
    door = sync_door(conn)
    requests = [j if isinstance(j, JobRequest) else job(**j) for j in jobs]
    rows = prepare(requests, app)
    if app is None:
        _unregistered(door, rows)
    if len(requests) == 1 or not any(r.idempotency_key for r in requests):
        # one statement is atomic by itself; without keys no conflict can undo part of it
        inserted = door.insert(rows, topic)
        _raise_conflicts(requests, inserted)
        return [Enqueued.of(i) for i in inserted]
    # a conflict found after the statement must undo the batch's other rows, and only them
    with door.savepoint():
        inserted = door.insert(rows, topic)
        _raise_conflicts(requests, inserted)
    return [Enqueued.of(i) for i in inserted]


def enqueue(
    conn: Any,
    job_type: str,
    payload: Any = None,
    *,
    app: App | None = None,
    idempotency_key: str | None = None,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
    timeout_seconds: int | None = None,
    ordering_key: str | None = None,
    unique: Unique | None = None,
    queue: str | None = None,
    priority: int | None = None,
    topic: str = TOPIC,
) -> Enqueued:
    """Enqueue one job in the caller's open transaction and return its id. ``conn``: a
    psycopg ``Connection``, or a SQLAlchemy ``Session`` or ``Connection``.

    ``payload`` may be JSON values or an instance of the type's payload model; ``delay``
    (seconds or a timedelta) or ``run_at`` (an aware datetime) defer it; ``idempotency_key``
    makes a repeat of the same request return the same job (a different request with the
    same key raises :class:`IdempotencyConflict`); ``queue`` names the queue it waits in
    (default: its type's, else ``default``; a queue that does not exist raises psycopg's
    ``DataError`` saying so, and the caller's transaction is aborted); ``priority``, 0 (the
    highest) to 3, orders it within its queue under backlog (default: its type's, else 0).
    """
    request = job(
        job_type,
        payload,
        idempotency_key=idempotency_key,
        delay=delay,
        run_at=run_at,
        max_attempts=max_attempts,
        timeout_seconds=timeout_seconds,
        ordering_key=ordering_key,
        unique=unique,
        queue=queue,
        priority=priority,
    )
    return enqueue_many(conn, [request], app=app, topic=topic)[0]


async def enqueue_many_async(
    conn: Any,
    jobs: Iterable[JobRequest | Mapping[str, Any]],
    *,
    app: App | None = None,
    topic: str = TOPIC,
) -> list[Enqueued]:
    """:func:`enqueue_many` for asyncio applications: ``conn`` is a psycopg
    ``AsyncConnection``, a SQLAlchemy ``AsyncSession`` or ``AsyncConnection`` (asyncpg or
    psycopg), or an asyncpg ``Connection``."""
    door = async_door(conn)
    requests = [j if isinstance(j, JobRequest) else job(**j) for j in jobs]
    rows = prepare(requests, app)
    if app is None:
        await _unregistered_async(door, rows)
    if len(requests) == 1 or not any(r.idempotency_key for r in requests):
        inserted = await door.insert(rows, topic)
        _raise_conflicts(requests, inserted)
        return [Enqueued.of(i) for i in inserted]
    async with door.savepoint():
        inserted = await door.insert(rows, topic)
        _raise_conflicts(requests, inserted)
    return [Enqueued.of(i) for i in inserted]


async def enqueue_async(
    conn: Any,
    job_type: str,
    payload: Any = None,
    *,
    app: App | None = None,
    idempotency_key: str | None = None,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
    timeout_seconds: int | None = None,
    ordering_key: str | None = None,
    unique: Unique | None = None,
    queue: str | None = None,
    priority: int | None = None,
    topic: str = TOPIC,
) -> Enqueued:
    """:func:`enqueue` for asyncio applications (``conn`` as for
    :func:`enqueue_many_async`)."""
    request = job(
        job_type,
        payload,
        idempotency_key=idempotency_key,
        delay=delay,
        run_at=run_at,
        max_attempts=max_attempts,
        timeout_seconds=timeout_seconds,
        ordering_key=ordering_key,
        unique=unique,
        queue=queue,
        priority=priority,
    )
    return (await enqueue_many_async(conn, [request], app=app, topic=topic))[0]
