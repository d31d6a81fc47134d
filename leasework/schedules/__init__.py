"""Recurring schedules without I/O: a cron expression in an IANA time zone, the instants it
ticks at, and what a scheduler does with the ticks due at a moment (:func:`plan`: the catch-up
and overlap policies). The clock is an argument, so every rule is tested with a fake one.

Cron expressions are parsed and evaluated by cronsim (maintained, written for Healthchecks'
cron monitoring), which follows Debian's cron, including across daylight-saving changes:

* a local time that does not exist (spring forward) ticks once, at the first valid instant
  after the gap (``30 2 * * *`` in New York on 2026-03-08 ticks at 03:00 EDT);
* a fixed local time that happens twice (fall back) ticks once, at its first occurrence;
* an expression with a wildcard or step in the hour field (``*/30 * * * *``) ticks by the
  clock on the wall each time it reads a matching value, so both 01:00 EDT and 01:00 EST of
  a fall-back night tick: they are different instants, each ticks once. A schedule that must
  tick by elapsed time rather than by the wall clock uses ``UTC``.

Six fields put seconds first (``*/5 * * * * *``: every five seconds); five are the classic
minute, hour, day of month, month, day of week.

A tick is identified by its schedule and its nominal instant (UTC, to the second): that pair
is what the store makes unique, so a tick can be inserted at most once however many
schedulers race for it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from leasework.job import TYPE_NAME_PATTERN

# a scheduler looks at no more than this many due ticks in one pass (a per-second schedule
# after a day's downtime has 86,400): the latest ones; older ones are counted as dropped
MAX_TICKS_PER_PASS = 1000
# older due ticks than those are counted up to this many (about 60 ms of cronsim), no further
MAX_DROPPED_COUNTED = 10_000
# a tick this late or less is on time; one later is missed, and the catch-up policy decides
DEFAULT_GRACE = timedelta(seconds=60)


class ScheduleError(ValueError):
    """A schedule's definition cannot be used; the message says what to change."""


class Overlap(StrEnum):
    """What a tick does while earlier runs of its schedule are unfinished."""

    ALLOW = "allow"  # runs anyway
    SKIP = "skip"  # skipped (recorded, reason overlap) while any run is unfinished
    BUFFER_ONE = "buffer_one"  # at most one run waits behind the unfinished one


class CatchUp(StrEnum):
    """What a schedule does with the ticks it missed (a scheduler was down, say)."""

    SKIP = "skip"  # none of them runs
    LATEST = "latest"  # the latest of them runs, once, unless a tick is due on time anyway
    ALL = "all"  # each runs, up to the policy's limit (the latest ones)


class SkipReason(StrEnum):
    CATCH_UP = "catch_up"
    OVERLAP = "overlap"
    # the tick's job would have been a duplicate: its type's unique key was held
    # (leasework.unique); recorded by the store, never planned here
    UNIQUE = "unique"


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ScheduleError(
            f"unknown time zone {name!r}: use an IANA name such as 'UTC', 'Europe/Berlin' "
            "or 'America/New_York'"
        ) from exc


def _utc(instant: datetime) -> datetime:
    if instant.tzinfo is None:
        raise ValueError("instants are timezone-aware (UTC); got a naive datetime")
    return instant.astimezone(UTC)


@dataclass(frozen=True)
class Cron:
    """A cron expression evaluated in an IANA time zone; instants in and out are UTC."""

    expression: str
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        zone = _zone(self.timezone)
        try:
            CronSim(self.expression, datetime(2000, 1, 1, tzinfo=zone))
        except CronSimError as exc:
            raise ScheduleError(
                f"cron expression {self.expression!r} is not valid ({exc}): five fields "
                "(minute hour day-of-month month day-of-week), or six with seconds first, "
                "e.g. '*/5 * * * *' for every five minutes"
            ) from exc

    def _iterate(self, start: datetime, reverse: bool = False) -> CronSim:
        zone = ZoneInfo(self.timezone)
        # to the second: a tick's identity is its schedule and its instant to the second
        local = _utc(start).replace(microsecond=0).astimezone(zone)
        return CronSim(self.expression, local, reverse=reverse)

    def after(self, instant: datetime) -> datetime | None:
        """The first tick strictly after ``instant``; None if there is none in 50 years."""
        instant = _utc(instant)
        for tick in self._iterate(instant):
            tick = tick.astimezone(UTC)
            if tick > instant:
                return tick
        return None

    def between(self, since: datetime, until: datetime, limit: int) -> list[datetime]:
        """The ticks in ``[since, until]``, oldest first, stopping after ``limit + 1`` of them
        (so a caller bounding a range sees that it holds more than ``limit`` without walking
        the rest: the cost is at most ``limit + 1`` steps of cronsim)."""
        since, until = _utc(since), _utc(until)
        ticks: list[datetime] = []
        # cronsim walks forward from its start exclusive: start one second before ``since``
        for tick in self._iterate(since - timedelta(seconds=1)):
            tick = tick.astimezone(UTC)
            if tick > until:
                break
            if tick < since:
                continue
            ticks.append(tick)
            if len(ticks) > limit:
                break
        return ticks

    def latest(self, since: datetime, until: datetime, limit: int) -> tuple[list[datetime], int]:
        """The ticks in ``[since, until]``, oldest first, at most the latest ``limit`` of
        them, and how many older ones were left out (counted up to
        :data:`MAX_DROPPED_COUNTED`)."""
        since, until = _utc(since), _utc(until)
        ticks: list[datetime] = []
        dropped = 0
        # cronsim walks back from its start exclusive: start one second past ``until``
        for tick in self._iterate(until + timedelta(seconds=1), reverse=True):
            tick = tick.astimezone(UTC)
            if tick < since:
                break
            if tick > until:
                continue
            if len(ticks) < limit:
                ticks.append(tick)
            else:
                dropped += 1
                if dropped >= MAX_DROPPED_COUNTED:
                    break
        ticks.reverse()
        return ticks, dropped


@dataclass(frozen=True)
class Policy:
    overlap: Overlap = Overlap.ALLOW
    catch_up: CatchUp = CatchUp.LATEST
    catch_up_limit: int = 1  # CatchUp.ALL: at most this many missed ticks run
    grace: timedelta = DEFAULT_GRACE

    def __post_init__(self) -> None:
        if self.catch_up_limit < 1:
            raise ScheduleError("catch_up_limit must be at least 1")
        if self.grace < timedelta(0):
            raise ScheduleError("grace cannot be negative")

    def capacity(self, unfinished: int) -> int | None:
        """How many runs may start now with ``unfinished`` runs of the schedule neither
        finished nor dead (None: no bound)."""
        if self.overlap is Overlap.ALLOW:
            return None
        bound = 1 if self.overlap is Overlap.SKIP else 2
        return max(0, bound - unfinished)


@dataclass(frozen=True)
class Plan:
    """What to do now: the ticks to fire (a job each), the ticks skipped and why, how many
    older due ticks were not even looked at (missed, counted up to
    :data:`MAX_DROPPED_COUNTED`), and the schedule's next fire time."""

    fire: tuple[datetime, ...]
    skipped: tuple[tuple[datetime, SkipReason], ...]
    dropped: int
    next_fire_at: datetime | None


def plan(
    cron: Cron,
    policy: Policy,
    next_fire_at: datetime,
    now: datetime,
    unfinished: int = 0,
    max_ticks: int = MAX_TICKS_PER_PASS,
) -> Plan:
    """The ticks due at ``now`` of a schedule whose next fire time was ``next_fire_at``, and
    what becomes of each: on-time ticks (at most ``policy.grace`` late) are candidates; of
    the missed ones the catch-up policy picks; of the candidates the overlap policy lets
    the latest ``capacity`` fire. Ticks dropped for the per-pass bound count as missed."""
    now = _utc(now)
    next_fire_at = _utc(next_fire_at)
    if next_fire_at > now:
        return Plan((), (), 0, next_fire_at)
    due, dropped = cron.latest(next_fire_at, now, max_ticks)
    on_time = [t for t in due if now - t <= policy.grace]
    missed = [t for t in due if now - t > policy.grace]
    if policy.catch_up is CatchUp.SKIP:
        caught: list[datetime] = []
    elif policy.catch_up is CatchUp.LATEST:
        caught = missed[-1:] if not on_time else []
    else:
        caught = missed[-policy.catch_up_limit :]
    candidates = caught + on_time
    skipped = [(t, SkipReason.CATCH_UP) for t in missed if t not in caught]
    capacity = policy.capacity(unfinished)
    if capacity is not None and len(candidates) > capacity:
        cut = len(candidates) - capacity
        skipped += [(t, SkipReason.OVERLAP) for t in candidates[:cut]]
        candidates = candidates[cut:]
    skipped.sort()
    return Plan(tuple(candidates), tuple(skipped), dropped, cron.after(now))


# a schedule's name follows the job type's rule (the schedules table's CHECK spells it too)
NAME_PATTERN = TYPE_NAME_PATTERN


@dataclass(frozen=True)
class Definition:
    """What a schedule is, as an app declares it or an operator creates it: which job it
    inserts (``type`` and ``payload``) on which calendar (``cron`` in ``timezone``) under
    which policy. Checked when made: a definition that exists can be stored and fired."""

    name: str
    type: str
    cron: str
    payload: Any = field(default_factory=dict)
    timezone: str = "UTC"
    overlap: Overlap = Overlap.ALLOW
    catch_up: CatchUp = CatchUp.LATEST
    catch_up_limit: int = 1
    grace_seconds: int = int(DEFAULT_GRACE.total_seconds())

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.match(self.name):
            raise ScheduleError(
                f"schedule name {self.name!r} is invalid: use 1-100 letters, digits and _ . : -"
            )
        if not isinstance(self.type, str) or not NAME_PATTERN.match(self.type):
            raise ScheduleError(f"job type {self.type!r} of schedule {self.name!r} is invalid")
        try:
            object.__setattr__(self, "overlap", Overlap(self.overlap))
            object.__setattr__(self, "catch_up", CatchUp(self.catch_up))
        except ValueError as exc:
            raise ScheduleError(
                f"schedule {self.name!r}: {exc}; overlap is one of "
                f"{', '.join(Overlap)}, catch_up one of {', '.join(CatchUp)}"
            ) from None
        if not 1 <= self.catch_up_limit <= 1000:
            raise ScheduleError(f"schedule {self.name!r}: catch_up_limit must be 1-1000")
        if not 0 <= self.grace_seconds <= 86400:
            raise ScheduleError(f"schedule {self.name!r}: grace_seconds must be 0-86400")
        Cron(self.cron, self.timezone)  # raises ScheduleError on a bad expression or zone

    @property
    def calendar(self) -> Cron:
        return Cron(self.cron, self.timezone)

    def as_json(self) -> dict[str, Any]:
        """Every field as JSON (the policies by name): the api's view of it, and the store's
        row but for the payload's wrapper."""
        return {**asdict(self), "overlap": str(self.overlap), "catch_up": str(self.catch_up)}

    @property
    def policy(self) -> Policy:
        return Policy(
            overlap=self.overlap,
            catch_up=self.catch_up,
            catch_up_limit=self.catch_up_limit,
            grace=timedelta(seconds=self.grace_seconds),
        )

    def first_fire_at(self, now: datetime) -> datetime | None:
        """The next fire time of a schedule created (or re-timed) at ``now``: its first tick
        after ``now``. Ticks before a schedule existed are not missed; they never were."""
        return self.calendar.after(now)
