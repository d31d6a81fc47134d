"""What one request may cost the api, decided before it is paid (pure).

Every route has a body cap, named by kind in its entry of the route table
(:data:`leasework.api.routes.ROUTES`) and sized here from the settings: the guard refuses
a larger body with a 413 before any parser reads a byte (at once, from ``Content-Length``, or
as soon as a streamed body passes the cap), and every body must arrive within
``LEASEWORK_BODY_READ_TIMEOUT`` (a 408 otherwise), on every route, the fast path included.
A body that passes is parsed on the event loop only when it is small
(:data:`OFFLOAD_BYTES`); a larger one is decoded, walked and validated in a worker thread, at
most :data:`PARSE_CONCURRENCY` at once, and at most :data:`LARGE_BODIES` bodies over
:data:`LARGE_BODY_BYTES` are held in memory at once (a 503 with ``Retry-After`` beyond).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from leasework.config import Settings


class BodyKind(StrEnum):
    SUBMIT = "submit"  # POST /jobs: one job, LEASEWORK_MAX_BODY_BYTES
    BATCH = "batch"  # POST /jobs/batch: LEASEWORK_MAX_BATCH_BYTES
    WEBHOOK = "webhook"  # Alertmanager's notifications: LEASEWORK_MAX_WEBHOOK_BYTES
    FORM = "form"  # the console's forms: LEASEWORK_MAX_FORM_BYTES
    SMALL = "small"  # everything else: LEASEWORK_MAX_SMALL_BODY_BYTES


CONSOLE_PREFIX = "/ui"

OFFLOAD_BYTES = 32 * 1024  # a body larger than this is parsed in a worker thread
PARSE_CONCURRENCY = 2  # such parses at once per process (the machine's cores)
LARGE_BODY_BYTES = 1_048_576  # a body larger than this holds one of LARGE_BODIES slots
LARGE_BODIES = 8


@dataclass(frozen=True)
class BodyLimits:
    """Bytes per kind of body, and how long a body may take to arrive."""

    submit: int
    batch: int
    webhook: int
    form: int
    small: int
    read_timeout: float

    @classmethod
    def from_settings(cls, settings: Settings) -> BodyLimits:
        return cls(
            submit=settings.max_body_bytes,
            batch=settings.max_batch_bytes,
            webhook=settings.max_webhook_bytes,
            form=settings.max_form_bytes,
            small=settings.max_small_body_bytes,
            read_timeout=settings.body_read_timeout,
        )

    def of(self, kind: BodyKind) -> int:
        return int(getattr(self, kind.value))

    def largest(self) -> int:
        return max(self.of(kind) for kind in BodyKind)

    def for_request(self, kind: BodyKind | None, path: str) -> int:
        """The cap of a request to ``path``, whose route takes bodies of ``kind`` (None: no
        route of the api's table: the console's form cap under ``/ui``, else the small one)."""
        if path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/"):
            return self.form
        return self.small if kind is None else self.of(kind)
