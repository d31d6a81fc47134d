"""Every Prometheus metric leasework exports. None is labelled by job id; the ``type`` label
takes only the job types of the loaded app (anything else is reported as ``other``)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

_known_types: frozenset[str] = frozenset()


def register_types(names: Iterable[str]) -> None:
    """The job types of the app this process loaded: the only values of the ``type`` label."""
    global _known_types
    _known_types = frozenset(names)


def type_label(job_type: str) -> str:
    """The value of the ``type`` label: bounded to the app's types."""
    return job_type if job_type in _known_types else "other"


# the SLI: start minus due time; the objective is 99% within 5 s, so buckets are dense
# around 5 s and sparse beyond it
SCHEDULING_DELAY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 4, 5, 6, 7.5, 10, 15, 30, 60, 300)

jobs_submitted = Counter("leasework_jobs_submitted", "Jobs accepted by the API", ["type"])
jobs_executed = Counter(
    "leasework_jobs_executed", "Handler executions by outcome", ["type", "outcome"]
)
execution_seconds = Histogram(
    "leasework_job_execution_seconds",
    "Handler run time",
    ["type"],
    buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
scheduling_delay = Histogram(
    "leasework_scheduling_delay_seconds",
    "Job start time minus its due time",
    buckets=SCHEDULING_DELAY_BUCKETS,
)
lease_expirations = Counter(
    "leasework_lease_expirations", "Running jobs requeued by the reaper after their lease expired"
)
fence_rejections = Counter(
    "leasework_fence_rejections", "Terminal writes refused because a newer fence holds the job"
)
lease_loss_cancellations = Counter(
    "leasework_lease_loss_cancellations", "Handlers cancelled because their lease was lost"
)
stale_fence_refusals = Counter(
    "leasework_stale_fence_refusals",
    "Attempts a downstream service refused because it had seen a higher fence for the job",
)
lease_renewals = Counter("leasework_lease_renewals", "Lease renewals by result", ["result"])
lease_renewal_seconds = Histogram(
    "leasework_lease_renewal_seconds",
    "Lease renewal latency",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
retries = Counter("leasework_retries", "Failed attempts rescheduled for a retry", ["type"])
dead_letters = Counter("leasework_dead_letters", "Jobs given up on (sent to jobs.dlq)", ["type"])
outbox_pending = Gauge("leasework_outbox_pending", "Outbox rows not yet acknowledged by Kafka")
outbox_oldest_age = Gauge(
    "leasework_outbox_oldest_age_seconds", "Age of the oldest unpublished outbox row"
)
relay_last_tick = Gauge(
    "leasework_relay_last_tick_timestamp_seconds", "Unix time the relay last finished a pass"
)
relay_published = Counter("leasework_relay_published", "Outbox rows acknowledged by Kafka")
relay_batch_size = Histogram(
    "leasework_relay_batch_size",
    "Outbox rows per relay pass that had any (one produce request per leader it touches)",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
)
relay_publish_failures = Counter(
    "leasework_relay_publish_failures", "Outbox rows Kafka did not acknowledge (kept, retried)"
)
promoted = Counter("leasework_jobs_promoted", "Due scheduled or failed jobs queued")
lost_republished = Counter(
    "leasework_lost_records_republished",
    "Waiting jobs published again because Kafka no longer held their records, by how that "
    "was known (consumed, deleted, truncated, recreated, timed-out)",
    ["reason"],
)
lost_marks_retired = Counter(
    "leasework_lost_records_marks_retired",
    "Marks of watched jobs retired by the recovery service, by verdict; a mark whose jobs had "
    "all moved on retires with nothing published again",
    ["reason"],
)
lost_watched = Gauge(
    "leasework_lost_records_watched_jobs",
    "Published jobs waiting to start that the recovery service watches now",
)
rate_waits = Counter(
    "leasework_jobs_rate_waits",
    "Claimed jobs that wait for the later start their type's rate limit reserved them",
)
limit_released = Counter(
    "leasework_jobs_limit_released",
    "Jobs held by a full concurrency limit queued again once it had room",
)
schedule_ticks_fired = Counter(
    "leasework_schedule_ticks_fired",
    "Schedule ticks that inserted their job (source: cron on time, catch_up late)",
    ["schedule", "source"],
)
schedule_ticks_skipped = Counter(
    "leasework_schedule_ticks_skipped",
    "Schedule ticks recorded as skipped by policy (reason: catch_up, overlap, unique)",
    ["schedule", "reason"],
)
schedule_ticks_late = Counter(
    "leasework_schedule_ticks_late",
    "Schedule ticks no scheduler handled within their grace: fired late, skipped, or dropped",
    ["schedule"],
)
consumer_lag = Gauge(
    "leasework_consumer_lag",
    "Messages of a queue's priority band's partition its consumer group has not committed past",
    ["queue", "priority", "partition"],
)
jobs_in_flight = Gauge("leasework_jobs_in_flight", "Jobs this worker is running now")
redeliveries_skipped = Counter(
    "leasework_messages_skipped",
    "Messages for jobs not runnable (finished, running, not due)",
    ["reason"],
)
event_loop_lag = Histogram(
    "leasework_event_loop_lag_seconds",
    "How late a 100 ms Trio sleep wakes up",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
)
dependency_up = Gauge(
    "leasework_dependency_up",
    "1 while the dependency answers the readiness probe",
    ["dependency"],
)
fence_reseeds = Counter(
    "leasework_fence_reseeds",
    "Stamps refused because Redis handed out a fence not above Postgres's; counter re-seeded",
)
lease_conflicts = Counter(
    "leasework_lease_conflicts", "Claims refused because another worker holds the lease"
)
wakeups = Counter(
    "leasework_worker_wakeups",
    "Jobs a Postgres wake-up named that this worker, its queue quiet, claimed at once, by "
    "result (started; lost: another worker or the Kafka delivery had it; error: Kafka "
    "delivers it) or skipped (busy: the queue had jobs in flight)",
    ["result"],
)
jobs_deferred = Counter(
    "leasework_jobs_deferred",
    "Jobs put back for later because this worker's app does not define their type",
)
jobs_pruned = Counter("leasework_jobs_pruned", "Finished jobs deleted by the pruner", ["status"])
rows_pruned = Counter(
    "leasework_rows_pruned",
    "Rows the pruner deleted by age alone (audit_log, alert_notifications, schedule_ticks)",
    ["table"],
)
worker_errors = Counter(
    "leasework_worker_errors",
    "Messages whose handling hit an unexpected error (a bug): left uncommitted, the worker lives",
)
completer_waiting = Gauge(
    "leasework_completer_waiting",
    "Outcomes handed to the completer and not yet durable (waiting for, or in, a batch)",
)
completer_batch_size = Histogram(
    "leasework_completer_batch_size",
    "Outcomes per completer write",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200),
)
claim_batch_size = Histogram(
    "leasework_claim_batch_size",
    "Messages per claim of a batch (each batch costs a row read, a lease script and a stamp)",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200),
)
rate_limit_unavailable = Counter(
    "leasework_rate_limit_unavailable",
    "Requests let through unmetered because the rate-limit store (Redis) was unreachable",
)
rate_limited = Counter(
    "leasework_rate_limited", "Requests refused with 429 by a token's rate limit"
)
auth_refused = Counter("leasework_auth_refused", "Requests refused 401 or 403", ["status"])
requests_refused = Counter(
    "leasework_requests_refused",
    "Requests the api's guard refused for their body (too large, too slow, too many large "
    "ones at once) before any parser read it",
    ["reason"],
)
auth_failures = Counter(
    "leasework_auth_failures",
    "Token checks that failed, by reason (malformed, unknown_prefix, wrong_secret, "
    "refused_again: the same wrong token within a minute; throttled: answered late)",
    ["reason"],
)
doctor_overridden = Gauge(
    "leasework_doctor_overridden",
    "1 for each failed start-up check this process started past because LEASEWORK_DOCTOR_ALLOW "
    "overrides it: it runs against an unsafe setup",
    ["check"],
)
audit_jobs_checked = Counter(
    "leasework_audit_jobs_checked",
    "Finished jobs the auditor checked (effects, outcomes, attempts), from its watermark on",
)
audit_violations = Counter(
    "leasework_audit_violations",
    "Violations of the promise the auditor found, by invariant (each job once per kind)",
    ["kind"],
)
audit_watermark = Gauge(
    "leasework_audit_watermark_timestamp_seconds",
    "finished_at of the last finished job the auditor checked (unix time)",
)
audit_last_pass = Gauge(
    "leasework_audit_last_pass_timestamp_seconds",
    "When this process's auditor last completed a pass (unix time)",
)
loop_guard_renewals = Counter(
    "leasework_loop_guard_renewals",
    "Leases the worker's loop guard renewed from its thread while the event loop was blocked "
    "(a trio-lane handler that does not yield: leasework/worker/loop_guard.py)",
)
loop_guard_exits = Counter(
    "leasework_loop_guard_exits",
    "Times the loop guard ended its worker: the loop blocked past every running handler's "
    "timeout, or a thread-lane handler running far past its own (seen after the restart)",
)
lane_busy = Gauge(
    "leasework_lane_busy",
    "Handlers running in each lane of this worker (thread, asyncio, process; the trio lane's "
    "are leasework_jobs_in_flight's), abandoned threads included until they return",
    ["lane"],
)
lane_waiting = Gauge(
    "leasework_lane_waiting",
    "Started jobs waiting for room in their lane (its capacity is full), by lane",
    ["lane"],
)
lane_held_back = Gauge(
    "leasework_lane_held_back",
    "Messages waiting unclaimed, their queue slots given back, for room in their lane "
    "(leasework/worker/lane_gate.py), by lane",
    ["lane"],
)
lane_seconds = Histogram(
    "leasework_lane_seconds",
    "How long a handler ran in its lane (thread, asyncio, process)",
    ["lane"],
    buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900),
)
relay_producer_renewals = Counter(
    "leasework_relay_producer_renewals",
    "Producers the relay replaced because a topic it publishes to was deleted and made again "
    "(its id changed; librdkafka's producer times out every record of the new topic)",
)
consumer_renewals = Counter(
    "leasework_consumer_renewals",
    "Consumers a worker replaced because their topic was deleted and made again under them "
    "(its id changed; librdkafka's consumer does not fetch the new topic), by queue and priority",
    ["queue", "priority"],
)
consumer_offset_resets = Counter(
    "leasework_consumer_offset_resets",
    "Partitions a worker's consumer started again at the log start for want of a usable "
    "offset (auto.offset.reset is error), by reason: no_committed_offset (a new group, or its "
    "offsets expired), out_of_range (Kafka deleted records the group had not read), "
    "log_truncated (the log ends before the group's offset), other",
    ["queue", "priority", "reason"],
)
