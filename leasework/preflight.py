"""Start-up checks: the api, relay, worker and dev roles run ``leasework doctor``'s checks
once before they serve, and refuse to start on a failure that breaks the promise.

What refuses a start (:func:`decide`, pure):

- a failed check, unless ``LEASEWORK_DOCTOR_ALLOW`` overrides it (a check's name, a prefix of
  names such as ``kafka.replication``, ``single-replica`` for the replication checks, or
  ``all``). An overridden failure lets the process start; it is logged at WARNING, listed in
  ``/readyz`` under ``overridden`` (still 200), on the console's overview and as
  ``leasework_doctor_overridden{check}`` = 1.
- never a warning, and never a failure that does not break the promise
  (:data:`NOT_BLOCKING`: no live API token leaves the api refusing requests, nothing lost;
  a topic's ``retention.ms`` below the doctor's bound or a finite ``retention.bytes``
  (:data:`NOT_BLOCKING_PREFIXES`): Kafka deletes a backlog older or bigger than that, Postgres
  still holds its jobs and leasework republishes them, and a worker refused a start would only
  let the backlog grow older and bigger, which is what those settings delete).
- never an unreachable dependency (the doctor's ``kafka``, ``redis`` and ``postgres``
  checks: it could not connect or log in, or gave no answer within :data:`BUDGET`). The
  roles wait for their dependencies and name them in ``/readyz``; a process that exits
  because Redis is briefly down is restarted into the same outage. Its checks are deferred:
  they run every :data:`DEFER_INTERVAL` until the dependency answers, and a failure that
  refuses found then drains the process and exits it with status 1, as at start.

The checks of the three dependencies run at once, each in a thread (the gatherers block),
within :data:`BUDGET` seconds in all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import trio

from leasework import doctor, metrics
from leasework.config import DOCTOR_ALLOW_ALL, DOCTOR_SINGLE_REPLICA, Settings
from leasework.doctor import FAIL, OK, Check
from leasework.health import Health

log = logging.getLogger("leasework.preflight")

DEPENDENCIES = ("kafka", "redis", "postgres")
# failures that do not break "nothing lost, nothing twice": reported, never refuse a start
NOT_BLOCKING = frozenset({"postgres.tokens"})
# ... and these checks of every topic (kafka.retention.jobs.ready, ...): reported, logged at
# every start, never refuse (the module docstring says why)
NOT_BLOCKING_PREFIXES = ("kafka.retention", "kafka.retention_bytes")
# what LEASEWORK_DOCTOR_ALLOW=single-replica stands for (as doctor --allow-single-replica)
SINGLE_REPLICA_CHECKS = ("kafka.replication", "kafka.min_insync")
BUDGET = 12.0  # seconds for all the start-up checks; a dependency slower is "unreachable"
DEFER_INTERVAL = 5.0  # seconds between tries of a dependency unreachable at start
VARIABLE = "LEASEWORK_DOCTOR_ALLOW"


class Refused(Exception):
    """The start-up checks found a failure that breaks the promise and no override."""

    def __init__(self, message: str, checks: Sequence[Check] = ()) -> None:
        super().__init__(message)
        self.checks = tuple(checks)


@dataclass(frozen=True)
class Verdict:
    refused: tuple[Check, ...] = ()  # failures that break the promise: the process stops
    overridden: tuple[Check, ...] = ()  # failures an override let pass
    unreachable: tuple[Check, ...] = ()  # dependencies that could not be checked
    noted: tuple[Check, ...] = ()  # warnings, and failures that do not break the promise


def allowed(name: str, allow: Iterable[str]) -> bool:
    """Whether ``allow`` (LEASEWORK_DOCTOR_ALLOW's entries) overrides the check ``name``: an
    entry is ``all``, ``single-replica``, a check's name or a dotted prefix of names."""
    for entry in allow:
        prefixes = SINGLE_REPLICA_CHECKS if entry == DOCTOR_SINGLE_REPLICA else (entry,)
        if entry == DOCTOR_ALLOW_ALL or any(
            name == p or name.startswith(p + ".") for p in prefixes
        ):
            return True
    return False


def blocking(name: str) -> bool:
    """Whether a failure of the check ``name`` refuses a start (pure)."""
    if name in NOT_BLOCKING:
        return False
    return not any(name.startswith(prefix + ".") for prefix in NOT_BLOCKING_PREFIXES)


def decide(checks: Iterable[Check], allow: Sequence[str]) -> Verdict:
    """Sort the doctor's checks into what refuses a start, what an override lets pass, what
    could not be checked and what is only reported (pure; the rules: module docstring)."""
    sorted_: dict[str, list[Check]] = {"refused": [], "overridden": [], "unreachable": []}
    noted: list[Check] = []
    for check in checks:
        if check.status == OK:
            continue
        if check.name in DEPENDENCIES:
            sorted_["unreachable"].append(check)
        elif check.status != FAIL or not blocking(check.name):
            noted.append(check)
        elif allowed(check.name, allow):
            sorted_["overridden"].append(check)
        else:
            sorted_["refused"].append(check)
    return Verdict(
        refused=tuple(sorted_["refused"]),
        overridden=tuple(sorted_["overridden"]),
        unreachable=tuple(sorted_["unreachable"]),
        noted=tuple(noted),
    )


def refusal(refused: Sequence[Check]) -> str:
    """The message a refused start ends with: what failed and the override that names it."""
    names = ",".join(c.name for c in refused)
    return (
        f"refusing to start: {len(refused)} start-up check(s) failed that break the promise "
        f"({names}); fix them (each check's fix is logged above, `leasework doctor` shows them "
        f"again), or, knowing what you give up, start anyway with {VARIABLE}={names} "
        "(logged, and shown in /readyz and on the console)"
    )


def _facts(check: Check) -> dict[str, str]:
    return {"check": check.name, "found": check.found, "why": check.why, "fix": check.fix}


def gatherers(settings: Settings) -> dict[str, Callable[[], list[Check]]]:
    """Each dependency's doctor gatherer, with no override of its own (decide applies them)."""
    return {
        "kafka": lambda: doctor.gather_kafka(settings, doctor.Options()),
        "redis": lambda: doctor.gather_redis(settings),
        "postgres": lambda: doctor.gather_postgres(settings),
    }


async def gather(settings: Settings, names: Sequence[str], budget: float = BUDGET) -> list[Check]:
    """The checks of the dependencies ``names``, all at once in threads, within ``budget``
    seconds; one that takes longer (or raises) is an unreachable check."""
    calls = gatherers(settings)
    limiter = trio.CapacityLimiter(max(1, len(names)))
    results: dict[str, list[Check]] = {}

    async def one(name: str) -> None:
        with trio.move_on_after(budget):
            try:
                results[name] = await trio.to_thread.run_sync(
                    calls[name], limiter=limiter, abandon_on_cancel=True
                )
            except Exception as exc:  # a bug in a gatherer must not pass for a pass
                log.exception("preflight: the %s checks raised", name)
                error = f"{type(exc).__name__}: {exc}"
                results[name] = [doctor.unreachable(name, name, error, "see the traceback")]
            return
        results[name] = [
            doctor.unreachable(name, name, f"no answer within {budget:g}s", "check that it runs")
        ]

    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(one, name)
    return [check for name in names for check in results[name]]


class Preflight:
    """The start-up checks of one process: :meth:`start` before it serves, then
    :meth:`run_deferred` for the dependencies that could not be checked at start."""

    def __init__(self, settings: Settings, health: Health) -> None:
        self.settings = settings
        self.health = health
        self.pending: tuple[str, ...] = ()  # dependencies whose checks are still to run
        self.refused: tuple[Check, ...] = ()
        self.seconds = 0.0  # how long the checks at start took

    async def start(self, names: Sequence[str] = DEPENDENCIES) -> Verdict:
        """Run every check once; raises :class:`Refused` on a failure that breaks the
        promise."""
        began = trio.current_time()
        verdict = self.apply(decide(await gather(self.settings, names), self.settings.doctor_allow))
        self.seconds = trio.current_time() - began
        log.info(
            "start-up checks done",
            extra={
                "seconds": round(self.seconds, 3),
                "overridden": [c.name for c in verdict.overridden],
                "deferred": list(self.pending),
            },
        )
        if verdict.refused:
            raise Refused(refusal(verdict.refused), verdict.refused)
        return verdict

    def apply(self, verdict: Verdict) -> Verdict:
        """Log the verdict and record it: overrides in ``/readyz`` and the metric, the
        unreachable dependencies as pending."""
        for check in verdict.noted:
            log.warning("start-up check %s: %s", check.status, check.name, extra=_facts(check))
        for check in verdict.overridden:
            log.warning(
                "start-up check failed, OVERRIDDEN by %s: the process runs against an unsafe setup",
                VARIABLE,
                extra=_facts(check),
            )
            if check.name not in {o["check"] for o in self.health.overridden}:
                self.health.overridden.append({"check": check.name, "found": check.found})
            metrics.doctor_overridden.labels(check.name).set(1)
        for check in verdict.unreachable:
            log.warning(
                "start-up checks of %s deferred: it cannot be reached now; they run once it "
                "answers (every %gs)",
                check.name,
                DEFER_INTERVAL,
                extra=_facts(check),
            )
        for check in verdict.refused:
            log.error("start-up check failed: %s", check.name, extra=_facts(check))
        self.pending = tuple(c.name for c in verdict.unreachable)
        self.refused = verdict.refused
        return verdict

    async def run_deferred(self, drain: Callable[[str], None]) -> None:
        """Try the dependencies unreachable at start until each answers; a failure that
        refuses, found then, logs as at start and ``drain``s the process (exit status 1)."""
        while self.pending:
            await trio.sleep(DEFER_INTERVAL)
            before = self.pending
            verdict = self.apply(
                decide(await gather(self.settings, before), self.settings.doctor_allow)
            )
            for name in sorted(set(before) - set(self.pending)):
                log.info("deferred start-up checks ran", extra={"dependency": name})
            if verdict.refused:
                message = refusal(verdict.refused).replace("refusing to start", "stopping")
                log.error(message)
                self.health.conditions["preflight"] = message
                drain("start-up checks failed")
                return


def failure_lines(checks: Sequence[Check]) -> list[str]:
    """The doctor's lines for ``checks`` (found, why, fix), without its summary."""
    return doctor.render(checks).splitlines()[:-1]
