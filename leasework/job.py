"""The job as code past the store sees it: a typed record built from a row."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from leasework.states import Status

# What every door accepts (the app's declarations, HTTP, ``enqueue``, the SQL function in
# migration 0002, the OpenAPI document): one definition each, tested equal to the SQL's.
TYPE_NAME_REGEX = r"^[A-Za-z0-9_.:-]{1,100}$"
TYPE_NAME_PATTERN = re.compile(TYPE_NAME_REGEX)
TYPE_NAME_HINT = "1-100 letters, digits and _ . : -"
MAX_ATTEMPTS = 100
MAX_TIMEOUT_SECONDS = 86_400
MAX_DELAY_SECONDS = 366 * 86_400
MAX_KEY_CHARS = 200  # idempotency and ordering keys


@dataclass(frozen=True, slots=True)
class Job:
    id: uuid.UUID
    type: str
    payload: Any
    status: Status
    run_at: datetime
    attempt: int
    max_attempts: int
    timeout_seconds: int
    fence: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    idempotency_key: str | None
    ordering_key: str | None
    last_error: str | None
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result: Any
    retry_base: float | None
    retry_cap: float | None
    deferrals: int
    attempt_budget: int
    # the schedule and nominal tick instant a job came from (None for every other door)
    schedule: str | None = None
    tick_at: datetime | None = None
    # the job's unique key (a sha256) and the states it holds it in, a bitmask of
    # leasework.unique.STATE_BITS (None: it asked for no uniqueness)
    unique_key: bytes | None = None
    unique_states: int | None = None
    # the named queue it waits in (leasework.queues): its Kafka topic and its workers
    queue: str = "default"
    # its priority within the queue (leasework.queues.priorities): 0, the highest, to 3
    priority: int = 0
    # the start a rate limit reserved for it (leasework.rates), until the stamp starts it
    rate_slot_at: datetime | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        values = {name: row[name] for name in COLUMN_NAMES}
        values["status"] = Status(values["status"])
        return cls(**values)

    @property
    def scheduling_delay(self) -> float:
        """Seconds from when it was due to when this attempt started (the SLI)."""
        if self.started_at is None:
            return 0.0
        return max(0.0, (self.started_at - self.run_at).total_seconds())


COLUMN_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Job))
COLUMNS = ", ".join(COLUMN_NAMES)
