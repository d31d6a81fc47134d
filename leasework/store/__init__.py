"""Every SQL statement leasework runs, as functions of a psycopg connection, by area:
:mod:`.submit` (every door's insert), :mod:`.jobs` (read, list, cancel, retry),
:mod:`.relay` (outbox, promoter, pruner), :mod:`.worker` (claim, heartbeat, fenced finish,
the reaper's select and write). Callers use ``store.name``; this module re-exports them.

Functions are named noun first (``jobs_insert``, ``outbox_fetch``) and run inside the
transaction their caller opened (:meth:`leasework.db.Database.run` opens one per call).
Status changes are checked against :mod:`leasework.states` before they are written, and
every WHERE clause that changes a status names the states it may come from. Inserting jobs
goes through the SQL function ``leasework_jobs_insert`` (migration 0002), the same one the
SQL door ``leasework_enqueue`` calls, so every door writes the same rows. Rows become
:class:`leasework.job.Job` records here, at the boundary.
"""

from leasework.store.common import JOB_COLUMNS, Row
from leasework.store.jobs import (
    CancelOutcome,
    CancelResult,
    RetryOutcome,
    RetryResult,
    job_cancel,
    job_get,
    job_list,
    job_retry,
    jobs_retry_matching,
)
from leasework.store.relay import (
    OutboxBatch,
    OutboxMessage,
    Watched,
    delivery_mark_retire,
    delivery_marks,
    delivery_marks_fill,
    delivery_watch,
    delivery_watched,
    jobs_promote_due,
    jobs_prune,
    jobs_release_limited,
    jobs_republish_lost,
    outbox_fetch,
    outbox_pending,
    outbox_retire,
)
from leasework.store.submit import (
    EncodedRows,
    Inserted,
    job_types_register,
    jobs_insert,
    jobs_insert_async,
    jobs_insert_begun,
)
from leasework.store.worker import (
    Stamped,
    effects_apply,
    fence_max,
    jobs_defer_many,
    jobs_expired,
    jobs_finish_many,
    jobs_get_many,
    jobs_heartbeat_many,
    jobs_hold_paused,
    jobs_reap_many,
    jobs_start_many,
    jobs_unfence_many,
    jobs_wait_rate,
    rate_floors,
)

__all__ = [
    "JOB_COLUMNS",
    "CancelOutcome",
    "CancelResult",
    "Inserted",
    "OutboxBatch",
    "OutboxMessage",
    "RetryOutcome",
    "RetryResult",
    "Row",
    "effects_apply",
    "fence_max",
    "job_cancel",
    "job_get",
    "job_list",
    "job_retry",
    "job_types_register",
    "jobs_defer_many",
    "jobs_hold_paused",
    "jobs_expired",
    "jobs_finish_many",
    "jobs_get_many",
    "jobs_heartbeat_many",
    "EncodedRows",
    "jobs_insert",
    "jobs_insert_async",
    "jobs_insert_begun",
    "jobs_promote_due",
    "jobs_release_limited",
    "jobs_republish_lost",
    "Watched",
    "delivery_mark_retire",
    "delivery_marks",
    "delivery_marks_fill",
    "delivery_watch",
    "delivery_watched",
    "jobs_prune",
    "jobs_reap_many",
    "jobs_retry_matching",
    "Stamped",
    "jobs_start_many",
    "jobs_wait_rate",
    "rate_floors",
    "jobs_unfence_many",
    "outbox_fetch",
    "outbox_pending",
    "outbox_retire",
]
