"""``leasework doctor``: a preflight of what "nothing lost, nothing twice" needs from Kafka,
Redis and Postgres.

Two halves. The checks are pure functions from facts (what a dependency answered) to
:class:`Check` records, each saying what it found, why it matters and how to fix it; they are
unit-tested without servers. The gatherers at the edge (:func:`gather_kafka`,
:func:`gather_redis`, :func:`gather_postgres`) connect to one dependency each, collect its
facts, run its checks, and turn an unreachable dependency into one failed check that says so.

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

from leasework.config import Settings

log = logging.getLogger("leasework.doctor")

OK, WARN, FAIL = "ok", "warn", "fail"

# what devstack creates for jobs.ready (devstack/layout.py KAFKA_TOPICS)
DEFAULT_READY_PARTITIONS = 12
MIN_REPLICATION = 3
MIN_INSYNC = 2
MIN_POSTGRES_VERSION = 150000  # server_version_num of 15.0
CLOCK_FAIL_FRACTION = 1 / 4  # of the lease TTL
CLOCK_WARN_FRACTION = 1 / 20
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
        "min.insync.replicas could not be read"
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
    checks.append(check_producer(producer))
    return checks


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


def gather_kafka(settings: Settings, options: Options, timeout: float = 5.0) -> list[Check]:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource

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
        topics = []
        for name in (settings.topic_ready, settings.topic_dlq):
            found = metadata.topics.get(name)
            if found is None or found.error is not None:
                error = str(found.error) if found is not None else None
                topics.append(TopicFacts(name, False, error))
                continue
            partitions = list(found.partitions.values())
            resource = ConfigResource(ConfigResource.Type.TOPIC, name)
            min_insync = None
            try:
                configs = admin.describe_configs([resource])[resource].result(timeout=timeout)
                entry = configs.get("min.insync.replicas")
                min_insync = int(entry.value) if entry is not None else None
            except KafkaException as exc:
                log.warning("doctor: describe_configs %s failed: %s", name, exc)
            topics.append(
                TopicFacts(
                    name,
                    True,
                    partitions=len(partitions),
                    leaderless=sum(1 for p in partitions if p.leader < 0),
                    replication=min((len(p.replicas) for p in partitions), default=0),
                    min_insync=min_insync,
                )
            )
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
    producer = producer_config(
        settings.kafka_brokers, "leasework-doctor", settings.kafka_properties
    )
    return kafka_checks(topics, producer, options, settings.topic_ready)


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
