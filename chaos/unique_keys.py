"""The unique-keys checker: every insert the run's unique load made, at every door, against
the jobs that hold its keys once the run is over. Pure: rows in, findings and counts out.

The load (:mod:`chaos.unique_load`) asks for uniqueness by one payload field ``k`` in every
state, so a key may be held by at most one job, ever. Each insert ends one of four ways:

- ``committed``: its transaction committed (the HTTP api answered 2xx, or the harness's own
  ``COMMIT`` returned); its answer names a job, created or ``duplicate``;
- ``rolled_back``: the harness rolled its transaction back on purpose;
- ``failed``: it certainly wrote nothing (an error before ``COMMIT``, a 4xx, a 503 whose
  contract is "nothing was written", a connection never opened);
- ``unknown``: it may have committed (an HTTP answer lost, a ``COMMIT`` whose answer was
  lost).

Per key, with *jobs* the rows holding it:

==========================  ===============================================================
``unique_doubled``          more than one job holds the key: the index let a second in
``unique_dropped``          an insert committed, yet no job holds the key: a waiter was
                            answered ``duplicate`` of a holder that rolled back (oban#1087)
``unique_wrong_answer``     a committed answer names a job that does not hold the key
``unique_created_twice``    two committed answers both say they created the key's job
``unique_phantom``          a job holds the key though every insert of it rolled back or
                            failed (none unknown): a rollback that took effect anyway
``unique_empty`` (unknown)  no insert committed: the run shows nothing
==========================  ===============================================================

Measures: keys, keys committed, jobs, answers by kind, inserts by door and outcome, and
*handoffs*: keys whose first creating insert rolled back and a later one created the job
(the waiter inserted after the holder's rollback, the path oban#1087 dropped).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from chaos.checker import UNKNOWN, Checked, Finding

COMMITTED, ROLLED_BACK, FAILED, UNKNOWN_OUTCOME = "committed", "rolled_back", "failed", "unknown"
OUTCOMES: tuple[str, ...] = (COMMITTED, ROLLED_BACK, FAILED, UNKNOWN_OUTCOME)
# the doors an insert may take (chaos.unique_load): POST /jobs, POST /jobs/batch,
# leasework.enqueue, leasework.enqueue_many, the SQL function leasework_enqueue
DOORS: tuple[str, ...] = ("http", "batch", "enqueue", "enqueue_many", "sql")
# the counts a verdict sums and the judge bounds
VIOLATIONS: tuple[str, ...] = ("doubled", "dropped", "wrong_answer", "created_twice", "phantom")
MAX_LISTED = 20  # keys named per kind of finding


@dataclass(frozen=True)
class UniqueInsert:
    """One item of one insert: the key it asked for, the door, how its transaction ended,
    and its answer (the job id; ``duplicate`` True/False, or None when the door does not
    say, as the SQL function does not). ``started``/``ended``: seconds into the run."""

    key: str
    door: str
    outcome: str
    job_id: str | None = None
    duplicate: bool | None = None
    started: float = 0.0
    ended: float = 0.0
    error: str | None = None

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r}: one of {', '.join(OUTCOMES)}")
        if self.door not in DOORS:
            raise ValueError(f"door {self.door!r}: one of {', '.join(DOORS)}")

    @property
    def created(self) -> bool:
        """Its answer says it created the job (False when it said duplicate or nothing)."""
        return self.job_id is not None and self.duplicate is False

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> UniqueInsert:
        return cls(
            key=str(row["key"]),
            door=str(row["door"]),
            outcome=str(row["outcome"]),
            job_id=None if row.get("job_id") is None else str(row["job_id"]),
            duplicate=row.get("duplicate"),
            started=float(row.get("started", 0.0)),
            ended=float(row.get("ended", 0.0)),
            error=row.get("error"),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class UniqueJob:
    """A job row holding one of the run's keys (its payload's ``k``)."""

    id: str
    key: str
    status: str = ""

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> UniqueJob:
        return cls(id=str(row["id"]), key=str(row["key"]), status=str(row.get("status") or ""))


@dataclass(frozen=True)
class UniqueObservation:
    """What the checker is given: every insert item, and the jobs holding the run's keys."""

    inserts: tuple[UniqueInsert, ...]
    jobs: tuple[UniqueJob, ...] = ()

    @classmethod
    def of(
        cls, inserts: Iterable[Mapping[str, Any]], jobs: Iterable[Mapping[str, Any]]
    ) -> UniqueObservation:
        return cls(tuple(UniqueInsert.of(r) for r in inserts), tuple(UniqueJob.of(r) for r in jobs))

    @classmethod
    def from_tables(cls, tables: Mapping[str, Any]) -> UniqueObservation | None:
        """From ``tables.json``'s ``unique_inserts`` and ``unique_jobs``; None for a run
        without a unique load."""
        if "unique_inserts" not in tables:
            return None
        return cls.of(tables["unique_inserts"], tables.get("unique_jobs", ()))


@dataclass(frozen=True)
class UniqueVerdict:
    """The run's keys, counted."""

    keys: int
    keys_committed: int
    jobs: int
    inserts: int
    created: int  # committed answers that created their key's job
    duplicates: int  # committed answers of duplicate
    handoffs: int
    doubled: int
    dropped: int
    wrong_answer: int
    created_twice: int
    phantom: int
    by_door: dict[str, dict[str, int]]

    def total(self, name: str) -> int:
        if name not in VIOLATIONS:
            raise ValueError(f"{name!r} is not a count of violations; one of {VIOLATIONS}")
        return int(getattr(self, name))

    @property
    def violations(self) -> int:
        return sum(self.total(name) for name in VIOLATIONS)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _listed(keys: Sequence[str]) -> str:
    shown = ", ".join(keys[:MAX_LISTED])
    return shown + (f" and {len(keys) - MAX_LISTED} more" if len(keys) > MAX_LISTED else "")


def _handoff(inserts: Sequence[UniqueInsert]) -> bool:
    """A creating insert rolled back, and a later one created the key's job and committed."""
    ordered = sorted(inserts, key=lambda i: i.started)
    for n, first in enumerate(ordered):
        if first.outcome == ROLLED_BACK and first.created:
            return any(
                later.outcome == COMMITTED and later.created and later.ended >= first.ended
                for later in ordered[n + 1 :]
            )
    return False


def check_unique(observed: UniqueObservation) -> Checked:
    """Every key of the run against the jobs holding it (the module's table)."""
    by_key: dict[str, list[UniqueInsert]] = defaultdict(list)
    for insert in observed.inserts:
        by_key[insert.key].append(insert)
    jobs_of: dict[str, list[UniqueJob]] = defaultdict(list)
    for job in observed.jobs:
        jobs_of[job.key].append(job)
    found: dict[str, list[str]] = {name: [] for name in VIOLATIONS}
    handoffs = committed_keys = 0
    for key in sorted(set(by_key) | set(jobs_of)):
        inserts, jobs = by_key.get(key, []), jobs_of.get(key, [])
        outcomes = Counter(i.outcome for i in inserts)
        committed = [i for i in inserts if i.outcome == COMMITTED]
        committed_keys += bool(committed)
        holders = {j.id for j in jobs}
        if len(jobs) > 1:
            found["doubled"].append(f"{key} ({len(jobs)} jobs)")
        if committed and not jobs:
            found["dropped"].append(f"{key} ({len(committed)} committed)")
        wrong = [i for i in committed if i.job_id is not None and i.job_id not in holders]
        if wrong and jobs:
            found["wrong_answer"].append(f"{key} (answered {wrong[0].job_id})")
        if sum(i.created for i in committed) > 1:
            found["created_twice"].append(key)
        if jobs and not committed and not outcomes[UNKNOWN_OUTCOME]:
            found["phantom"].append(key)
        handoffs += _handoff(inserts)
    findings = [
        Finding(f"unique_{name}", False, f"unique_{name}: {len(keys)} key(s): {_listed(keys)}")
        for name, keys in found.items()
        if keys
    ]
    if not committed_keys:
        findings.append(
            Finding("unique_empty", UNKNOWN, "unique_empty: no unique insert committed")
        )
    by_door: dict[str, dict[str, int]] = {}
    for insert in observed.inserts:
        counts = by_door.setdefault(insert.door, dict.fromkeys(OUTCOMES, 0))
        counts[insert.outcome] += 1
    committed_all = [i for i in observed.inserts if i.outcome == COMMITTED]
    verdict = UniqueVerdict(
        keys=len(set(by_key) | set(jobs_of)),
        keys_committed=committed_keys,
        jobs=len(observed.jobs),
        inserts=len(observed.inserts),
        created=sum(i.created for i in committed_all),
        duplicates=sum(i.duplicate is True for i in committed_all),
        handoffs=handoffs,
        by_door={door: by_door[door] for door in DOORS if door in by_door},
        **{name: len(keys) for name, keys in found.items()},
    )
    return Checked(tuple(findings), {"unique": verdict})
