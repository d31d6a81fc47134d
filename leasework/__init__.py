"""leasework: a distributed job scheduler on Postgres, Kafka and Redis.

The public surface is what this module exports; everything else is internal and may change.
``tests/unit/test_exports.py`` pins it.
"""

from leasework.app import App, JobType
from leasework.client import ApiError, AsyncClient, Client
from leasework.context import JobContext
from leasework.enqueue import (
    Enqueued,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    job,
)
from leasework.errors import (
    AppError,
    AppLoadError,
    FenceUnavailable,
    FieldError,
    IdempotencyConflict,
    InvalidJob,
    JobFailed,
    LeaseworkError,
    Permanent,
    Retry,
    StaleFence,
    UnknownJobType,
    WaitTimeout,
)
from leasework.states import Status
from leasework.unique import Unique, UniqueError

__all__ = [
    "ApiError",
    "App",
    "AppError",
    "AppLoadError",
    "AsyncClient",
    "Client",
    "Enqueued",
    "FenceUnavailable",
    "FieldError",
    "IdempotencyConflict",
    "InvalidJob",
    "JobContext",
    "JobFailed",
    "JobType",
    "LeaseworkError",
    "Permanent",
    "Retry",
    "StaleFence",
    "Status",
    "Unique",
    "UniqueError",
    "UnknownJobType",
    "WaitTimeout",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "job",
]
