"""The record of one run: everything the report is written from, once.

:class:`RunRecord` holds the scenario, the history, the tables the checker saw, the verdict,
the judgement and :class:`RunDetails`, what the harness did and saw (setup, faults as
injected, the client's counts, the system's counters, Kafka, the shop, alerts, recovery,
quiet). :func:`chaos.report.write_report` turns it into ``report.json``, ``report.md`` and
``timeline.svg``; ``details.to_dict()`` is the report's ``run`` section.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaos.alerts import AlertArrival
    from chaos.auditor import AuditorView
    from chaos.history import Op
    from chaos.judge import Judgement
    from chaos.links import Link
    from chaos.messages import MessageView
    from chaos.nemesis import Injection
    from chaos.quiet import Quiet
    from chaos.scenario import Scenario
    from chaos.shop import ShopView
    from chaos.verdict import Verdict
    from chaos.workload import ClientView, Drain, WorkloadStats


@dataclass(frozen=True)
class Setup:
    """What the harness did before the run: the baseline's actions, each process's extra
    environment, and the private proxies it added."""

    baseline: tuple[str, ...]
    process_env: Mapping[str, Mapping[str, str]]
    links: tuple[Link, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": list(self.baseline),
            "process_env": {name: dict(env) for name, env in self.process_env.items()},
            "links": [dict(dataclasses.asdict(link), name=link.name) for link in self.links],
        }


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class AlertDelivery:
    """One alert's first notification through Alertmanager to the api's webhook: when
    Prometheus had it firing (``fired``, seconds after the run's start, from ``ALERTS``;
    ``starts_at``, the notification's own ``startsAt``) and when the api received it
    (``received_at`` in UTC; ``received`` after the run's start, ``after_fault`` after its
    first fault started, negative for an alert the workload tripped before the fault)."""

    fired: float | None
    starts_at: str | None
    received_at: str
    received: float
    after_fault: float | None

    @classmethod
    def of(
        cls, d: AlertArrival, fired: float | None, start_epoch: float, fault_epoch: float | None
    ) -> AlertDelivery:
        return cls(
            None if fired is None else round(fired - start_epoch, 1),
            None if d.starts_at is None else _iso(d.starts_at),
            _iso(d.received_at),
            round(d.received_at - start_epoch, 1),
            None if fault_epoch is None else round(d.received_at - fault_epoch, 1),
        )


@dataclass(frozen=True)
class AlertsSeen:
    """The alerts the scenario expects, those already firing when the run started (None:
    not readable), those that fired during it, by seconds after its start (None: not
    readable), and the notifications of them that reached the api through Alertmanager
    (None: not readable)."""

    expected: tuple[str, ...]
    firing_at_start: frozenset[str] | None
    fired: Mapping[str, float] | None
    delivered: Mapping[str, AlertDelivery] | None = None

    @classmethod
    def of(
        cls,
        expected: Sequence[str],
        firing_at_start: set[str] | None,
        fired: Mapping[str, float] | None,
        start_epoch: float,
        delivered: Mapping[str, AlertArrival] | None = None,
        fault_epoch: float | None = None,
    ) -> AlertsSeen:
        """``fired``: alert name -> first Unix time it was firing; ``delivered``: alert
        name -> its first notification; ``fault_epoch``: when the first fault started."""
        fired_at = fired or {}
        return cls(
            tuple(expected),
            frozenset(firing_at_start) if firing_at_start is not None else None,
            (
                {name: round(t - start_epoch, 1) for name, t in sorted(fired.items())}
                if fired is not None
                else None
            ),
            (
                {
                    name: AlertDelivery.of(d, fired_at.get(name), start_epoch, fault_epoch)
                    for name, d in sorted(delivered.items())
                }
                if delivered is not None
                else None
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "expected": list(self.expected),
            "firing_at_start": (
                sorted(self.firing_at_start) if self.firing_at_start is not None else None
            ),
            "fired": dict(self.fired) if self.fired is not None else None,
            "delivered": (
                {name: dataclasses.asdict(d) for name, d in self.delivered.items()}
                if self.delivered is not None
                else None
            ),
        }


@dataclass(frozen=True)
class RecoveryRow:
    """One fault's recovery: the checker's first finish after the heal, and the harness's
    drain (until every job created and due before the heal had finished)."""

    fault: str
    target: str | None
    stopped: float | None
    first_finish: float | None
    drained: float | None
    jobs: int | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def recovery_rows(verdict: Verdict, drains: Sequence[Drain]) -> tuple[RecoveryRow, ...]:
    drain_by = {(d.fault, d.target, d.stopped): d for d in drains}
    rows = []
    for r in verdict.recovery:
        d = drain_by.get((r.fault, r.target, r.stopped)) if r.stopped is not None else None
        rows.append(
            RecoveryRow(
                r.fault,
                r.target,
                r.stopped,
                r.seconds,
                d.seconds if d else None,
                d.jobs if d else None,
            )
        )
    return tuple(rows)


@dataclass(frozen=True)
class RunDetails:
    """What the harness did and what the system did, in one run."""

    key_prefix: str  # the run's Idempotency-Keys start with it
    seed: int  # of the workload's plan
    lease_mode: str
    run_started_at: datetime  # wall-clock time of history time zero
    setup: Setup
    faults: tuple[Injection, ...]  # as injected, in order
    client: WorkloadStats
    client_view: ClientView
    counters: Mapping[str, float]  # summed over processes and restarts (lower bounds)
    kafka: MessageView | None  # None: jobs.ready could not be read
    shop: ShopView | None  # None: the scenario placed no orders
    alerts: AlertsSeen
    counters_per_process: Mapping[str, Mapping[str, float]]
    scrape_failures: Mapping[str, int]
    recovery: tuple[RecoveryRow, ...]
    quiet: Quiet
    harness_problems: tuple[str, ...]  # the harness's own findings (chaos.judge.HARNESS)
    interference: tuple[str, ...]
    crashed: tuple[str, ...]
    seconds: float  # the whole run
    workload_seconds: float  # load and faults
    auditor: AuditorView | None = None  # the relay's auditor on the run's jobs

    def to_dict(self) -> dict[str, Any]:
        """The report's ``run`` section (JSON values only)."""
        return {
            "key_prefix": self.key_prefix,
            "seed": self.seed,
            "lease_mode": self.lease_mode,
            "run_started_at": self.run_started_at.isoformat(),
            "setup": self.setup.to_dict(),
            "faults": [i.to_dict() for i in self.faults],
            "client": self.client.to_dict(),
            "client_view": self.client_view.to_dict(),
            "counters": dict(self.counters),
            "kafka": self.kafka.to_dict() if self.kafka is not None else None,
            "shop": self.shop.to_dict() if self.shop is not None else None,
            "auditor": self.auditor.to_dict() if self.auditor is not None else None,
            "alerts": self.alerts.to_dict(),
            "counters_per_process": {k: dict(v) for k, v in self.counters_per_process.items()},
            "scrape_failures": dict(self.scrape_failures),
            "recovery": [r.to_dict() for r in self.recovery],
            "quiet": self.quiet.to_dict(),
            "harness_problems": list(self.harness_problems),
            "interference": list(self.interference),
            "crashed": list(self.crashed),
            "seconds": round(self.seconds, 1),
            "workload_seconds": round(self.workload_seconds, 1),
        }


@dataclass(frozen=True)
class RunRecord:
    """One run, whole: what the report is written from. ``details`` is None for a run that
    was not driven by the runner (a history checked offline, a test)."""

    scenario: Scenario
    history: tuple[Op, ...]
    verdict: Verdict
    judgement: Judgement | None = None
    tables: Mapping[str, Any] | None = None  # the rows the checker saw (tables.json)
    details: RunDetails | None = None
