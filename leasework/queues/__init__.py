"""Named queues (pure): what a queue's name may be, its Kafka topic and its consumer group.

A job waits in one queue: its submit's ``queue``, else its type's (``@app.job(queue=...)``),
else ``default``. Each queue is a Kafka topic, so a queue's backlog is its own: ``jobs.ready``
for ``default`` (the topic before queues existed), ``jobs.ready.<name>`` for the others; and
each is consumed by a consumer group of its own, so one queue's consumers joining or leaving
never pauses another's (docs/design-decisions.md, "Queues: a Kafka topic and a consumer group
each"). The table ``queues`` (migration 0011) lists them; an insert naming a queue with no
row fails, saying how to create it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

DEFAULT = "default"
# a Kafka topic name's tail, kept short and lower-case (Postgres checks the same)
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}$")
NAME_RULE = (
    "1-48 characters of lower-case letters, digits, _ and -, starting with a letter or digit"
)
# the advisory lock a claim's stamp holds shared and a queue's pause exclusively (migration
# 0013): no job starts once a pause has committed
PAUSE_LOCK = (7305005, 0)
# the advisory lock class of a concurrency limit (migration 0014): a claim's stamp holds
# (LIMIT_LOCK, hashtext(limit)) for each limit of its batch while it counts and starts
LIMIT_LOCK = 7305006
# the run_at of a job held while its queue is paused (never due until the resume makes it due
# now) or while a concurrency limit is full (until the relay releases it); a finite time:
# psycopg cannot read 'infinity' into a datetime
HELD_UNTIL = datetime(9999, 1, 1, tzinfo=UTC)


def name_error(name: object) -> str | None:
    """Why ``name`` cannot name a queue (None: it can)."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        return f"must be {NAME_RULE}"
    return None


def ready_topic(base: str, queue: str) -> str:
    """The topic of ``queue``'s wake-up messages (``leasework_ready_topic`` in SQL)."""
    return base if queue == DEFAULT else f"{base}.{queue}"


def consumer_group(base: str, queue: str) -> str:
    """The consumer group of ``queue``'s workers: ``base`` for ``default`` (the group before
    queues existed, so its committed offsets stand), ``<base>.<queue>`` for the others."""
    return base if queue == DEFAULT else f"{base}.{queue}"


def parse_queues(text: str) -> tuple[str, ...]:
    """``emails,default`` as the queues a worker serves, in order, each once; raises
    ``ValueError`` naming a bad one."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError("name at least one queue, e.g. default or emails,default")
    for name in names:
        if (problem := name_error(name)) is not None:
            raise ValueError(f"queue {name!r}: {problem}")
    return tuple(dict.fromkeys(names))
