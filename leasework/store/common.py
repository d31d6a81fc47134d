"""What every part of the store shares: the job columns and the wake-up message in SQL."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from leasework.job import COLUMNS

Row = dict[str, Any]

JOB_COLUMNS = COLUMNS  # every column of jobs that leasework.job.Job holds, in its order

# the wake-up message of a queued job; leasework_jobs_insert builds the same in SQL
READY_VALUE_SQL = (
    "jsonb_build_object('job_id', {t}.id::text, 'type', {t}.type, 'attempt', {t}.attempt + 1)"
)
READY_HEADERS_SQL = "jsonb_build_object('job_id', {t}.id::text, 'type', {t}.type)"
READY_KEY_SQL = "coalesce({t}.ordering_key, {t}.id::text)"


def ready_outbox_insert(source: str, topic_param: str = "%(topic)s") -> str:
    """``INSERT INTO outbox`` of the ready messages of the jobs in CTE ``source``."""
    t = source
    return (
        f"INSERT INTO outbox (job_id, topic, key, value, headers) "
        f"SELECT {t}.id, {topic_param}, {READY_KEY_SQL.format(t=t)}, "
        f"{READY_VALUE_SQL.format(t=t)}, {READY_HEADERS_SQL.format(t=t)} FROM {t}"
    )


def dlq_outbox_add(conn: psycopg.Connection, job_id: uuid.UUID, topic: str) -> None:
    """The dead-letter message of a job that just died, built in SQL from its row (the payload
    never round-trips through Python: what the store holds is what the DLQ gets)."""
    conn.execute(
        """INSERT INTO outbox (job_id, topic, key, value, headers)
           SELECT id, %(topic)s, id::text,
                  jsonb_build_object('job_id', id::text, 'type', type, 'payload', payload),
                  jsonb_build_object('job_id', id::text, 'type', type,
                                     'attempts', attempt::text,
                                     'last_error', left(coalesce(last_error, ''), 1000))
           FROM jobs WHERE id = %(id)s""",
        {"id": job_id, "topic": topic},
    )
