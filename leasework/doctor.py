"""``leasework doctor``: a preflight of what "nothing lost, nothing twice" needs from Kafka,
Redis and Postgres.

Two halves. The checks are pure functions from facts (what a dependency answered) to
:class:`Check` records, each saying what it found, why it matters and how to fix it; they are
unit-tested without servers. The gatherers at the edge (:func:`gather_kafka`,
:func:`gather_redis`, :func:`gather_postgres`) connect to one dependency each, collect its
facts, run its checks, and turn an unreachable dependency into one failed check that says so.

Kafka topics: every topic leasework uses is checked, the ready topic and ``jobs.dlq`` (both must
exist) and each priority band's topic of each queue in Postgres's ``queues`` table (a worker
serving a queue makes its topics, so one missing only warns). Besides replication, each
topic's settings that make Kafka drop records before they are consumed are checked:
``unclean.leader.election.enable`` true, ``retention.ms`` below :data:`DEFAULT_MIN_RETENTION`
(``--min-retention``), any finite ``retention.bytes``, a ``cleanup.policy`` other than
``delete``. A setting the doctor cannot read (DescribeConfigs denied, as managed clusters
often do, or no answer in time) is a warning that says "unknown", never a pass.

Clock thresholds: the offset between this host's clock and a server's fails above a quarter of
the lease TTL and warns above a twentieth of it (10 s lease: fail > 2.5 s, warn > 0.5 s).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from leasework.config import Settings, masked
from leasework.queues import DEFAULT as DEFAULT_QUEUE
from leasework.queues.priorities import band_topics

log = logging.getLogger("leasework.doctor")

OK, WARN, FAIL = "ok", "warn", "fail"

# what devstack creates for jobs.ready (devstack/layout.py KAFKA_TOPICS)
DEFAULT_READY_PARTITIONS = 12
MIN_REPLICATION = 3
MIN_INSYNC = 2
MIN_POSTGRES_VERSION = 150000  # server_version_num of 15.0
CLOCK_FAIL_FRACTION = 1 / 4  # of the lease TTL
CLOCK_WARN_FRACTION = 1 / 20
# retention.ms below this fails (Kafka's own default, so an untouched cluster passes): a
# backlog waiting longer than the retention (workers down over a long weekend, a slow drain)
# loses its oldest records, and those jobs wait until leasework republishes them from Postgres
DEFAULT_MIN_RETENTION = 7 * 86400.0  # seconds
# the topic settings that decide whether Kafka drops records nobody consumed yet
UNCLEAN_ELECTION = "unclean.leader.election.enable"
RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
CLEANUP_POLICY = "cleanup.policy"
MIN_INSYNC_SETTING = "min.insync.replicas"
# LEASEWORK_DOCTOR_ALLOW=single-replica is the same override as --allow-single-replica
ALLOW_ENV = "LEASEWORK_DOCTOR_ALLOW"
SINGLE_REPLICA = "single-replica"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok, warn, fail
    found: str
    why: str = ""
    fix: str = ""


def ok(name: str, found: str) -> Check:
    return Check(name, OK, found)


# ---------------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class TopicFacts:
    name: str
    exists: bool
    error: str | None = None
    partitions: int = 0
    leaderless: int = 0  # partitions without a leader
    replication: int = 0  # the smallest replica count of any partition
    min_insync: int | None = None  # None: could not be read
    # the ready and dead-letter topics must exist; a queue's band topics are made by a worker
    # serving the queue (leasework.queues.operations), so one missing only warns
    required: bool = True
    # the settings that make Kafka drop unconsumed records (None: could not be read)
    unclean_election: bool | None = None
    retention_ms: int | None = None  # -1: no time limit
    retention_bytes: int | None = None  # -1: no size limit (per partition)
    cleanup_policy: str | None = None  # as Kafka lists it: "delete", "compact,delete"
    configs_error: str | None = None  # why the topic's settings could not be read


@dataclass(frozen=True)
class RedisFacts:
    appendonly: str | None  # None: CONFIG GET refused
    save: str | None
    maxmemory_policy: str | None
    clock_offset: float  # server minus host, seconds
    clock_uncertainty: float = 0.0  # half the round trip


@dataclass(frozen=True)
class PostgresFacts:
    server_version_num: int
    server_version: str
    synchronous_commit: str
    # version -> checksum; None: no schema_migrations table
    applied: Mapping[int, str] | None
    expected: Sequence[tuple[int, str, str]]  # (version, name, checksum) of the files
    clock_offset: float
    live_tokens: int | None  # None: no api_tokens table
    clock_uncertainty: float = 0.0


@dataclass
class Options:
    allow_single_replica: bool = False
    ready_partitions: int = DEFAULT_READY_PARTITIONS
    min_retention: float = DEFAULT_MIN_RETENTION  # seconds; retention.ms below it fails
    extra: dict[str, object] = field(default_factory=dict)


# --------------------------------------------------------------------------------- checks


def unreachable(name: str, what: str, error: object, fix: str) -> Check:
    return Check(
        name,
        FAIL,
        f"cannot reach {what}: {error}",
        "no other check of this dependency could run, and leasework cannot work without it",
        fix,
    )


def check_topic_exists(topic: TopicFacts) -> Check:
    name = f"kafka.topic.{topic.name}"
    if not topic.exists and not topic.required:
        return Check(
            name,
            WARN,
            f"topic {topic.name} does not exist ({topic.error or 'absent from the metadata'})",
            "it is a priority band of a queue: the relay cannot publish that band's jobs "
            "(they wait in the outbox, nothing is lost) until a worker serving the queue "
            "makes its topics at start; a topic that existed and is gone was deleted, with "
            "its records",
            "start a worker serving the queue (it makes every band's topic), or "
            "`leasework queues create NAME` for a queue with no topics yet",
        )
    if not topic.exists:
        return Check(
            name,
            FAIL,
            f"topic {topic.name} does not exist ({topic.error or 'absent from the metadata'})",
            "the relay publishes every job to it and the workers consume it; with the topic "
            "missing nothing is delivered (the broker does not create it: auto-create is off "
            "in any safe setup)",
            f"create it: kafka-topics.sh --create --topic {topic.name} --partitions N "
            f"--replication-factor {MIN_REPLICATION} --config min.insync.replicas={MIN_INSYNC}, "
            "or fix LEASEWORK topic settings if the name is wrong",
        )
    if topic.leaderless:
        return Check(
            name,
            FAIL,
            f"topic {topic.name}: {topic.leaderless} of {topic.partitions} partitions have no "
            "leader",
            "a partition without a leader accepts no writes and serves no reads: its jobs wait",
            "bring the brokers holding those replicas back; check `kafka-topics.sh --describe`",
        )
    return ok(name, f"topic {topic.name} exists, {topic.partitions} partitions, all led")


def check_partitions(topic: TopicFacts, expected: int | None) -> Check:
    name = f"kafka.partitions.{topic.name}"
    if expected is None or topic.partitions == expected:
        return ok(name, f"{topic.partitions} partitions")
    return Check(
        name,
        WARN,
        f"{topic.partitions} partitions, expected {expected}",
        "partitions bound how many workers consume in parallel; changing the count later "
        "moves ordering keys to other partitions (not a loss, but ordering across the change "
        "is not kept)",
        f"create the topic with {expected} partitions, or pass --partitions "
        f"{topic.partitions} if this count is intended",
    )


def _override(check: Check, allow: bool) -> Check:
    if check.status != FAIL or not allow:
        return check
    log.warning(
        "doctor: %s failed, downgraded to a warning by the single-replica override",
        check.name,
    )
    return Check(
        check.name,
        WARN,
        f"{check.found} (OVERRIDE IN FORCE: --allow-single-replica / "
        f"{ALLOW_ENV}={SINGLE_REPLICA}; development only)",
        check.why,
        check.fix,
    )


def check_replication(topic: TopicFacts, allow: bool = False) -> Check:
    name = f"kafka.replication.{topic.name}"
    if topic.replication >= MIN_REPLICATION:
        return ok(name, f"replication factor {topic.replication}")
    return _override(
        Check(
            name,
            FAIL,
            f"replication factor {topic.replication} (need >= {MIN_REPLICATION})",
            "with fewer than 3 replicas, one broker lost (a disk, a host) can take "
            "acknowledged jobs with it, and min.insync.replicas=2 cannot be kept while one "
            "broker is down: nothing lost needs 3",
            f"reassign {topic.name} to {MIN_REPLICATION} replicas "
            "(kafka-reassign-partitions.sh) or recreate it with --replication-factor 3",
        ),
        allow,
    )


def check_min_insync(topic: TopicFacts, allow: bool = False) -> Check:
    name = f"kafka.min_insync.{topic.name}"
    if topic.min_insync is not None and topic.min_insync >= MIN_INSYNC:
        return ok(name, f"min.insync.replicas={topic.min_insync}")
    found = (
        f"min.insync.replicas could not be read ({topic.configs_error or 'not in the answer'})"
        if topic.min_insync is None
        else f"min.insync.replicas={topic.min_insync} (need >= {MIN_INSYNC})"
    )
    return _override(
        Check(
            name,
            FAIL,
            found,
            "acks=all only waits for the in-sync replicas; with min.insync.replicas=1 a write "
            "acknowledged by the leader alone is lost if that leader dies before a follower "
            "copied it",
            f"kafka-configs.sh --alter --entity-type topics --entity-name {topic.name} "
            f"--add-config min.insync.replicas={MIN_INSYNC}",
        ),
        allow,
    )


def _span(seconds: float) -> str:
    """``7d``, ``36h``, ``90m``, ``45s``: a duration as its largest whole unit."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _configs_fix(topic: str, setting: str, wanted: str) -> str:
    return (
        f"kafka-configs.sh --alter --entity-type topics --entity-name {topic} "
        f"--add-config {setting}={wanted}"
    )


def _unknown(name: str, topic: TopicFacts, setting: str, why: str, wanted: str) -> Check:
    """A setting the doctor could not read: a warning, never a pass."""
    return Check(
        name,
        WARN,
        f"{setting} unknown: {topic.configs_error or 'not in the DescribeConfigs answer'}",
        f"{why}; the doctor could not read it, so it cannot say it is safe",
        f"allow DescribeConfigs on topic {topic.name} to leasework's principal (ACL operation "
        f"DESCRIBE_CONFIGS; managed clusters often deny it), or check it in the provider's "
        f"console: it must be {wanted}",
    )


UNCLEAN_WHY = (
    "when every in-sync replica of a partition is gone, an out-of-sync replica may become its "
    "leader, and the records it never copied are gone, acknowledged ones included"
)


def check_unclean_election(topic: TopicFacts) -> Check:
    name = f"kafka.unclean_election.{topic.name}"
    if topic.unclean_election is None:
        return _unknown(name, topic, UNCLEAN_ELECTION, UNCLEAN_WHY, "false")
    if not topic.unclean_election:
        return ok(name, f"{UNCLEAN_ELECTION}=false")
    return Check(
        name,
        FAIL,
        f"{UNCLEAN_ELECTION}=true",
        f"{UNCLEAN_WHY}: their jobs run only once leasework notices the lost records and "
        "republishes them from Postgres",
        f"{_configs_fix(topic.name, UNCLEAN_ELECTION, 'false')} (and the brokers' "
        "unclean.leader.election.enable=false, the default)",
    )


def _no_cleanup(topic: TopicFacts) -> bool:
    """An empty cleanup.policy (Kafka 4.2+): nothing is ever deleted, retention unused."""
    return topic.cleanup_policy is not None and not topic.cleanup_policy.strip()


def check_retention_time(topic: TopicFacts, min_retention: float) -> Check:
    name = f"kafka.retention.{topic.name}"
    bound_ms = int(min_retention * 1000)
    wanted = f"-1 or at least {bound_ms} ({_span(min_retention)})"
    why = (
        "Kafka deletes records older than retention.ms whether or not they were consumed: a "
        "backlog that waits longer (the workers down over a long weekend, a slow drain) loses "
        "its oldest records"
    )
    if _no_cleanup(topic):
        return ok(name, f"{RETENTION_MS} not applied: {CLEANUP_POLICY} is empty")
    if topic.retention_ms is None:
        return _unknown(name, topic, RETENTION_MS, why, wanted)
    if topic.retention_ms < 0:
        return ok(name, f"{RETENTION_MS}={topic.retention_ms} (no time limit)")
    found = f"{RETENTION_MS}={topic.retention_ms} ({_span(topic.retention_ms / 1000)})"
    if topic.retention_ms >= bound_ms:
        return ok(name, found)
    return Check(
        name,
        FAIL,
        f"{found}, below the bound {_span(min_retention)}",
        f"{why}, and their jobs run only once leasework notices the lost records and "
        "republishes them from Postgres",
        f"{_configs_fix(topic.name, RETENTION_MS, str(bound_ms))} (or -1); if a shorter "
        "retention is intended, say so with `leasework doctor --min-retention`",
    )


def check_retention_size(topic: TopicFacts) -> Check:
    name = f"kafka.retention_bytes.{topic.name}"
    why = (
        "Kafka deletes a partition's oldest segments once it holds more than retention.bytes, "
        "consumed or not: a big backlog (the workers down, a burst) loses its oldest records, "
        "however young they are"
    )
    if _no_cleanup(topic):
        return ok(name, f"{RETENTION_BYTES} not applied: {CLEANUP_POLICY} is empty")
    if topic.retention_bytes is None:
        return _unknown(name, topic, RETENTION_BYTES, why, "-1")
    if topic.retention_bytes < 0:
        return ok(name, f"{RETENTION_BYTES}={topic.retention_bytes} (no size limit)")
    return Check(
        name,
        FAIL,
        f"{RETENTION_BYTES}={topic.retention_bytes} per partition",
        f"{why}, and their jobs run only once leasework notices the lost records and "
        "republishes them from Postgres",
        f"{_configs_fix(topic.name, RETENTION_BYTES, '-1')}; bound the disk by retention.ms "
        "and an alert on the brokers' free space instead",
    )


def check_cleanup_policy(topic: TopicFacts) -> Check:
    name = f"kafka.cleanup_policy.{topic.name}"
    why = (
        "compaction keeps only the newest record of each key: jobs sharing an ordering key "
        "lose every record but the last before they are consumed, and a compacted topic "
        "refuses a record without a key (a job without an ordering key cannot be published)"
    )
    policy = topic.cleanup_policy
    if policy is None:
        return _unknown(name, topic, CLEANUP_POLICY, why, "delete")
    parts = [p.strip().lower() for p in policy.split(",") if p.strip()]
    if parts == ["delete"]:
        return ok(name, f"{CLEANUP_POLICY}=delete")
    if not parts:
        return ok(name, f"{CLEANUP_POLICY} empty (nothing deleted: records kept for ever)")
    return Check(
        name,
        FAIL,
        f"{CLEANUP_POLICY}={policy}",
        why,
        _configs_fix(topic.name, CLEANUP_POLICY, "delete"),
    )


def _truthy(value: object) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def check_producer(config: Mapping[str, object]) -> Check:
    acks = str(config.get("acks", "")).lower()
    idempotent = _truthy(config.get("enable.idempotence", False))
    found = f"acks={config.get('acks')}, enable.idempotence={config.get('enable.idempotence')}"
    if acks in ("all", "-1") and idempotent:
        return ok("kafka.producer", found)
    return Check(
        "kafka.producer",
        FAIL,
        found,
        "without acks=all a publish counts as done when only the leader has it (lost if it "
        "dies); without idempotence a retried send can write a job twice",
        "set acks=all and enable.idempotence=true in leasework.kafka.producer_config",
    )


def check_redis_persistence(facts: RedisFacts) -> Check:
    name = "redis.persistence"
    if facts.appendonly is None and facts.save is None:
        return Check(
            name,
            WARN,
            "CONFIG GET refused: persistence unknown",
            "a Redis restart without persistence forgets every lease and the fence counter, "
            "so a new lease could reuse a fence a stale worker still holds",
            "check the provider's settings for AOF (appendonly yes), or allow CONFIG GET",
        )
    if facts.appendonly == "yes":
        return ok(name, "appendonly yes (AOF)")
    if facts.save:
        return Check(
            name,
            WARN,
            f"RDB snapshots only (save {facts.save!r}), appendonly {facts.appendonly}",
            "a restart loses what changed since the last snapshot, the fence counter "
            "included: it may go back and hand out a fence again",
            "CONFIG SET appendonly yes (and write it to redis.conf)",
        )
    return Check(
        name,
        FAIL,
        f"no persistence: appendonly {facts.appendonly}, save {facts.save!r}",
        "a Redis restart forgets every lease and resets the fence counter, so a new lease "
        "can reuse a fence a stale worker still holds: a job's effect applied twice",
        "CONFIG SET appendonly yes and CONFIG REWRITE (or appendonly yes in redis.conf)",
    )


def check_redis_eviction(facts: RedisFacts) -> Check:
    name = "redis.eviction"
    policy = facts.maxmemory_policy
    if policy == "noeviction":
        return ok(name, "maxmemory-policy noeviction")
    return Check(
        name,
        FAIL if policy is not None else WARN,
        f"maxmemory-policy {policy}" if policy else "CONFIG GET refused: policy unknown",
        "any other policy may evict a lease (another worker claims the job while the first "
        "still runs) or the fence counter (fences start again): a job done twice; Sidekiq "
        "warns about the same",
        "CONFIG SET maxmemory-policy noeviction (and in redis.conf or the provider's settings)",
    )


def check_clock(name: str, what: str, offset: float, lease_ttl: float, uncertainty=0.0) -> Check:
    fail_at = lease_ttl * CLOCK_FAIL_FRACTION
    warn_at = lease_ttl * CLOCK_WARN_FRACTION
    found = (
        f"{what} clock is {offset:+.3f}s from this host's (±{uncertainty:.3f}s); "
        f"lease TTL {lease_ttl:g}s: warn above {warn_at:g}s, fail above {fail_at:g}s"
    )
    size = abs(offset)
    if size <= warn_at:
        return ok(name, found)
    return Check(
        name,
        FAIL if size > fail_at else WARN,
        found,
        "leases expire by the server's clock while a worker times its work by its own; an "
        "offset near the TTL lets a lease run out while its holder thinks it has time left",
        "run NTP (chrony or systemd-timesyncd) on this host and on the server",
    )


def check_postgres_version(facts: PostgresFacts) -> Check:
    name = "postgres.version"
    if facts.server_version_num >= MIN_POSTGRES_VERSION:
        return ok(name, f"Postgres {facts.server_version}")
    return Check(
        name,
        FAIL,
        f"Postgres {facts.server_version} (need >= 15)",
        "leasework's migrations and queries are written and tested for Postgres 15 and "
        "later; on an older server they may fail or behave differently",
        "upgrade the server to Postgres 15 or later",
    )


def check_synchronous_commit(facts: PostgresFacts) -> Check:
    name = "postgres.synchronous_commit"
    value = facts.synchronous_commit
    if value not in ("off", "local"):
        return ok(name, f"synchronous_commit={value}")
    return Check(
        name,
        FAIL,
        f"synchronous_commit={value}",
        "off: a commit is acknowledged before it is on disk, so a crash loses accepted jobs "
        "and finished results; local: a failover to a replica loses them",
        "ALTER SYSTEM SET synchronous_commit = on (and check the DSN's options, the role's "
        "and the database's settings: ALTER ROLE/DATABASE ... RESET synchronous_commit)",
    )


def check_migrations(facts: PostgresFacts) -> Check:
    name = "postgres.migrations"
    fix = "run `leasework migrate` (or `just migrate`) with this LEASEWORK_POSTGRES_DSN"
    if facts.applied is None:
        return Check(
            name,
            FAIL,
            "no schema_migrations table: the database was never migrated",
            "none of leasework's tables exist",
            fix,
        )
    files = {version: checksum for version, _, checksum in facts.expected}
    pending = sorted(set(files) - set(facts.applied))
    if pending:
        return Check(
            name,
            FAIL,
            f"pending migrations {pending} (applied {sorted(facts.applied)})",
            "this code expects tables and functions those migrations make; it fails or "
            "misbehaves on the old schema",
            fix,
        )
    ahead = sorted(set(facts.applied) - set(files))
    changed = sorted(v for v in files if facts.applied[v] != files[v])
    if ahead or changed:
        parts = []
        if ahead:
            parts.append(f"the database has migrations {ahead} this code does not know")
        if changed:
            parts.append(f"migrations {changed} changed after they were applied")
        return Check(
            name,
            WARN,
            "; ".join(parts),
            "normal during a rolling upgrade (migrations run before the new code); otherwise "
            "this code and the schema disagree",
            "finish the upgrade, or run the code that matches the database",
        )
    return ok(name, f"{len(files)} migrations, all applied (latest {max(files, default=0)})")


def check_tokens(facts: PostgresFacts) -> Check:
    name = "postgres.tokens"
    if facts.live_tokens:
        return ok(name, f"{facts.live_tokens} live API token(s)")
    found = "no api_tokens table" if facts.live_tokens is None else "no live API token"
    return Check(
        name,
        FAIL,
        found,
        "the api refuses every request without a token: nothing can be submitted",
        "leasework token create NAME --scopes admin (after `leasework migrate`)",
    )


def kafka_checks(
    topics: Iterable[TopicFacts],
    producer: Mapping[str, object],
    options: Options,
    ready_topic: str,
) -> list[Check]:
    checks: list[Check] = []
    for topic in topics:
        exists = check_topic_exists(topic)
        checks.append(exists)
        if not topic.exists:
            continue
        expected = options.ready_partitions if topic.name == ready_topic else None
        checks.append(check_partitions(topic, expected))
        checks.append(check_replication(topic, options.allow_single_replica))
        checks.append(check_min_insync(topic, options.allow_single_replica))
        checks.append(check_unclean_election(topic))
        checks.append(check_retention_time(topic, options.min_retention))
        checks.append(check_retention_size(topic))
        checks.append(check_cleanup_policy(topic))
    checks.append(check_producer(producer))
    return checks


def topics_to_check(ready: str, dlq: str, queues: Iterable[str]) -> list[tuple[str, bool]]:
    """Every topic leasework uses as (name, required), each once (pure): the ready topic and
    the dead-letter topic, then each priority band's topic of each queue, ``default`` first
    (its highest band is the ready topic itself)."""
    topics = {ready: True, dlq: True}
    for queue in sorted({*queues, DEFAULT_QUEUE}, key=lambda q: (q != DEFAULT_QUEUE, q)):
        for topic in band_topics(ready, queue):
            topics.setdefault(topic, False)
    return list(topics.items())


def topic_settings(values: Mapping[str, str | None]) -> dict[str, object]:
    """The :class:`TopicFacts` fields of a topic's DescribeConfigs answer (pure): a setting
    absent or not understood is None, which its check reports as unknown."""

    def number(key: str) -> int | None:
        try:
            return int(str(values[key]).strip())
        except (KeyError, ValueError):
            return None

    unclean = str(values.get(UNCLEAN_ELECTION)).strip().lower()
    policy = values.get(CLEANUP_POLICY)
    return {
        "min_insync": number(MIN_INSYNC_SETTING),
        "unclean_election": {"true": True, "false": False}.get(unclean),
        "retention_ms": number(RETENTION_MS),
        "retention_bytes": number(RETENTION_BYTES),
        "cleanup_policy": policy if isinstance(policy, str) else None,
    }


QUEUES_SHOWN = 10  # queue names the kafka.queues check lists before "and N more"


def check_queues(queues: Sequence[str] | None, error: str | None) -> Check:
    """Which queues' topics were checked: those in Postgres, or only ``default``'s when the
    ``queues`` table could not be read (a warning: the others went unchecked)."""
    name = "kafka.queues"
    if queues is not None:
        shown = ", ".join(queues[:QUEUES_SHOWN])
        more = f" and {len(queues) - QUEUES_SHOWN} more" if len(queues) > QUEUES_SHOWN else ""
        return ok(
            name, f"{len(queues)} queue(s) in Postgres ({shown}{more}): each band's topic checked"
        )
    return Check(
        name,
        WARN,
        f"the queues could not be read from Postgres ({error}): only the default queue's "
        "topics and the dead-letter topic were checked",
        "the other queues' topics went unchecked: a setting that loses their records would "
        "not be seen",
        "check LEASEWORK_POSTGRES_DSN and that the database is migrated (the postgres checks "
        "say), then run the doctor again",
    )


def redis_checks(facts: RedisFacts, lease_ttl: float) -> list[Check]:
    return [
        check_redis_persistence(facts),
        check_redis_eviction(facts),
        check_clock("redis.clock", "Redis", facts.clock_offset, lease_ttl, facts.clock_uncertainty),
    ]


def postgres_checks(facts: PostgresFacts, lease_ttl: float) -> list[Check]:
    return [
        check_postgres_version(facts),
        check_synchronous_commit(facts),
        check_migrations(facts),
        check_clock(
            "postgres.clock", "Postgres", facts.clock_offset, lease_ttl, facts.clock_uncertainty
        ),
        check_tokens(facts),
    ]


# ------------------------------------------------------------------------------- gathering


def _timed(call: Callable[[], float]) -> tuple[float, float]:
    """(offset of the server's clock from this host's, half the round trip)."""
    before = time.time()
    server = call()
    after = time.time()
    return server - (before + after) / 2, (after - before) / 2


def read_queues(settings: Settings) -> tuple[list[str] | None, str | None]:
    """The names in Postgres's ``queues`` table, sorted; (None, why) when they cannot be
    read (Postgres unreachable, the database not migrated)."""
    import psycopg

    kwargs = {**connect_kwargs(settings.postgres_dsn), "connect_timeout": 3}
    try:
        with psycopg.connect(settings.postgres_dsn, **kwargs) as conn:  # type: ignore[arg-type]
            rows = conn.execute("SELECT name FROM queues ORDER BY name").fetchall()
    except psycopg.Error as exc:
        lines = str(exc).strip().splitlines()
        return None, masked(lines[0] if lines else type(exc).__name__)
    return [row[0] for row in rows], None


Answer = tuple[dict[str, str | None] | None, str | None]  # a topic's settings, or why not


def _kafka_error(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g}s"
    error = exc.args[0] if exc.args else exc
    return error.str() if hasattr(error, "str") else str(error)


def describe_topic_configs(admin, names: Sequence[str], timeout: float) -> dict[str, Answer]:
    """Each topic's settings as DescribeConfigs answers them (one request for all), or
    (None, why) for a topic whose settings could not be read: denied (managed clusters often
    deny it), no answer within ``timeout`` seconds, the topic gone meanwhile."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    resources = {name: ConfigResource(ResourceType.TOPIC, name) for name in names}
    if not resources:
        return {}
    try:
        futures = admin.describe_configs(list(resources.values()), request_timeout=timeout)
    except KafkaException as exc:
        return {name: (None, _kafka_error(exc, timeout)) for name in names}
    deadline = time.monotonic() + timeout
    answers: dict[str, Answer] = {}
    for name, resource in resources.items():
        try:
            entries = futures[resource].result(timeout=max(0.1, deadline - time.monotonic()))
        except (KafkaException, TimeoutError) as exc:
            log.warning("doctor: describe_configs %s failed: %s", name, exc)
            answers[name] = (None, f"DescribeConfigs failed: {_kafka_error(exc, timeout)}")
            continue
        answers[name] = ({key: entry.value for key, entry in entries.items()}, None)
    return answers


def topic_facts(name: str, required: bool, found, answer: Answer | None) -> TopicFacts:
    """A topic's facts from its metadata (``found``: confluent-kafka's TopicMetadata, None
    when absent) and its DescribeConfigs ``answer`` (settings, or why they could not be
    read)."""
    if found is None or found.error is not None:
        error = str(found.error) if found is not None else None
        return TopicFacts(name, False, error, required=required)
    values, why = answer if answer is not None else (None, "not asked")
    partitions = list(found.partitions.values())
    return TopicFacts(
        name,
        True,
        partitions=len(partitions),
        leaderless=sum(1 for p in partitions if p.leader < 0),
        replication=min((len(p.replicas) for p in partitions), default=0),
        required=required,
        configs_error=why,
        **(topic_settings(values) if values is not None else {}),  # type: ignore[arg-type]
    )


def gather_kafka(
    settings: Settings,
    options: Options,
    timeout: float = 5.0,
    queues: Sequence[str] | None = None,
) -> list[Check]:
    """The Kafka checks of every topic leasework uses: the ready and dead-letter topics and
    each band's topic of ``queues`` (None: the queues in Postgres's ``queues`` table, and a
    ``kafka.queues`` check saying which were read)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from leasework.kafka import client_config, producer_config

    brokers = ",".join(settings.kafka_brokers)
    # librdkafka says why a connection failed (a refused SASL login, a certificate it does not
    # trust) only to the error callback; the exception says "transport failure"
    reasons: list[str] = []
    admin = AdminClient(
        {
            **client_config(settings.kafka_brokers, "leasework-doctor", settings.kafka_properties),
            "socket.connection.setup.timeout.ms": 3000,
            "log_level": 0,
            "error_cb": lambda error: reasons.append(error.str()),
        }
    )
    try:
        metadata = admin.list_topics(timeout=timeout)
        if not metadata.brokers:
            raise KafkaException("no broker in the metadata")
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        admin.poll(0.5)  # serves the error callbacks queued meanwhile
        said = kafka_reason(reasons)
        return [
            unreachable(
                "kafka",
                f"Kafka at {brokers}",
                f"{error}{f' ({said})' if said else ''}",
                "check LEASEWORK_KAFKA_BROKERS and that the brokers run (just up); for a "
                "secured Kafka, LEASEWORK_RDKAFKA_SECURITY_PROTOCOL, _SASL_MECHANISM, "
                "_SASL_USERNAME, _SASL_PASSWORD and _SSL_CA_LOCATION",
            )
        ]
    listing: list[Check] = []
    if queues is None:
        queues, why = read_queues(settings)
        listing.append(check_queues(queues, why))
    wanted = topics_to_check(settings.topic_ready, settings.topic_dlq, queues or ())
    present = [
        name
        for name, _ in wanted
        if (found := metadata.topics.get(name)) is not None and found.error is None
    ]
    configs = describe_topic_configs(admin, present, timeout)
    topics = [
        topic_facts(name, required, metadata.topics.get(name), configs.get(name))
        for name, required in wanted
    ]
    producer = producer_config(
        settings.kafka_brokers, "leasework-doctor", settings.kafka_properties
    )
    return [*listing, *kafka_checks(topics, producer, options, settings.topic_ready)]


def kafka_reason(reasons: list[str]) -> str | None:
    """The most telling of librdkafka's error callbacks (pure): an authentication or
    certificate failure over a plain "all brokers down"."""
    for marker in ("SASL", "authentication", "SSL", "certificate"):
        for reason in reasons:
            if marker.lower() in reason.lower():
                return reason
    return reasons[-1] if reasons else None


def _redis_config(client, key: str) -> str | None:
    import redis

    try:
        value = client.config_get(key).get(key)
    except redis.ResponseError:
        return None
    return value.decode() if isinstance(value, bytes) else value


def gather_redis(settings: Settings) -> list[Check]:
    import redis

    from leasework import redisconn

    client = redisconn.connect(settings.redis, timeout=3)
    try:
        try:
            client.ping()
            appendonly = _redis_config(client, "appendonly")
            save = _redis_config(client, "save")
            policy = _redis_config(client, "maxmemory-policy")

            def server_time() -> float:
                seconds, micros = client.time()
                return seconds + micros / 1e6

            offset, uncertainty = _timed(server_time)
        finally:
            client.close()
    except redis.RedisError as exc:
        return [
            unreachable(
                "redis",
                f"Redis at {settings.redis.describe()}",
                exc,
                "check LEASEWORK_REDIS_URL (user, password, LEASEWORK_REDIS_CA for rediss://) "
                "and that Redis runs (just up)",
            )
        ]
    facts = RedisFacts(appendonly, save, policy, offset, uncertainty)
    return redis_checks(facts, settings.lease_ttl)


def connect_kwargs(dsn: str) -> dict[str, object]:
    """libpq options for the doctor's connection: a statement timeout added to the DSN's own
    ``options`` (which are kept, so a DSN's ``-c synchronous_commit=off`` is seen)."""
    from psycopg.conninfo import conninfo_to_dict

    own = str(conninfo_to_dict(dsn).get("options") or "")
    return {
        "connect_timeout": 5,
        "autocommit": True,
        "options": f"{own} -c statement_timeout=5000".strip(),
    }


def gather_postgres(settings: Settings) -> list[Check]:
    import psycopg
    from psycopg.rows import dict_row

    from leasework.migrate import discover
    from leasework.store.operators import tokens_live

    try:
        with psycopg.connect(
            settings.postgres_dsn, row_factory=dict_row, **connect_kwargs(settings.postgres_dsn)
        ) as conn:
            version = conn.execute(
                "SELECT current_setting('server_version_num')::int AS num, "
                "current_setting('server_version') AS text"
            ).fetchone()
            sync = conn.execute("SHOW synchronous_commit").fetchone()["synchronous_commit"]
            offset, uncertainty = _timed(
                lambda: conn.execute("SELECT extract(epoch FROM now())::float8 AS t").fetchone()[
                    "t"
                ]
            )
            applied = None
            if conn.execute("SELECT to_regclass('schema_migrations') AS t").fetchone()["t"]:
                applied = {
                    row["version"]: row["checksum"]
                    for row in conn.execute("SELECT version, checksum FROM schema_migrations")
                }
            tokens = None
            if conn.execute("SELECT to_regclass('api_tokens') AS t").fetchone()["t"]:
                tokens = len(tokens_live(conn))
    except psycopg.Error as exc:
        return [
            unreachable(
                "postgres",
                "Postgres at LEASEWORK_POSTGRES_DSN",
                str(exc).strip(),
                "check LEASEWORK_POSTGRES_DSN and that Postgres runs (just up)",
            )
        ]
    expected = [(m.version, m.name, m.checksum) for m in discover()]
    facts = PostgresFacts(
        version["num"], version["text"], sync, applied, expected, offset, tokens, uncertainty
    )
    return postgres_checks(facts, settings.lease_ttl)


def run_checks(settings: Settings, options: Options) -> list[Check]:
    """Every check, the three dependencies gathered in parallel threads."""
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="doctor") as pool:
        kafka = pool.submit(gather_kafka, settings, options)
        redis = pool.submit(gather_redis, settings)
        postgres = pool.submit(gather_postgres, settings)
        return [*kafka.result(), *redis.result(), *postgres.result()]


# --------------------------------------------------------------------------------- output


LABELS = {OK: "ok  ", WARN: "WARN", FAIL: "FAIL"}


def render(checks: Sequence[Check]) -> str:
    lines = []
    for check in checks:
        lines.append(f"[{LABELS[check.status]}] {check.name}: {check.found}")
        if check.status != OK:
            lines.append(f"       why: {check.why}")
            lines.append(f"       fix: {check.fix}")
    lines.append(summary(checks))
    return "\n".join(lines)


def summary(checks: Sequence[Check]) -> str:
    counts = {status: sum(1 for c in checks if c.status == status) for status in (OK, WARN, FAIL)}
    verdict = "FAILED" if counts[FAIL] else "passed"
    return f"doctor {verdict}: {counts[OK]} ok, {counts[WARN]} warning(s), {counts[FAIL]} failed"


def exit_status(checks: Sequence[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0


def allow_from_env(environ: Mapping[str, str]) -> bool:
    allowed = {part.strip() for part in environ.get(ALLOW_ENV, "").split(",")}
    return SINGLE_REPLICA in allowed


def retention_bound(raw: str) -> float:
    """``--min-retention``: a duration above zero (``7d``, ``36h``, ``90m``), in seconds."""
    import argparse

    from leasework.config import ConfigError, parse_positive_duration

    try:
        return parse_positive_duration("--min-retention", raw) or DEFAULT_MIN_RETENTION
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub) -> None:
    p = sub.add_parser(
        "doctor", help="check that Kafka, Redis and Postgres are set up for the promise"
    )
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument(
        "--allow-single-replica",
        action="store_true",
        help="development only: replication factor and min.insync.replicas failures become "
        f"warnings (also {ALLOW_ENV}={SINGLE_REPLICA})",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=DEFAULT_READY_PARTITIONS,
        help=f"partitions expected on the ready topic (default {DEFAULT_READY_PARTITIONS})",
    )
    p.add_argument(
        "--min-retention",
        type=retention_bound,
        default=DEFAULT_MIN_RETENTION,
        metavar="DURATION",
        help="a topic's retention.ms below this fails (default 7d, Kafka's own default; "
        "-1, no time limit, always passes): e.g. 3d, 36h",
    )


def run(args, environ: Mapping[str, str] | None = None) -> int:
    import os

    from leasework import config

    env = os.environ if environ is None else environ
    try:
        settings = config.load("doctor", env)
    except config.ConfigError as exc:
        print(f"leasework doctor: invalid configuration: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    options = Options(
        allow_single_replica=args.allow_single_replica
        or allow_from_env(env)
        or SINGLE_REPLICA in settings.doctor_allow,
        ready_partitions=args.partitions,
        min_retention=args.min_retention,
    )
    if options.allow_single_replica:
        log.warning("doctor: the single-replica override is in force: replication checks only warn")
    checks = run_checks(settings, options)
    if args.json:
        print(
            json.dumps(
                {"checks": [asdict(c) for c in checks], "summary": summary(checks)}, indent=2
            )
        )
    else:
        print(render(checks))
    return exit_status(checks)
