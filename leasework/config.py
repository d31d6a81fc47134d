"""Process configuration from ``LEASEWORK_*`` environment variables.

Every variable is parsed and validated once, at start-up; an invalid value stops the
process with a message that names the variable, what it holds and what it should hold.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from leasework.job import MAX_ATTEMPTS, MAX_TIMEOUT_SECONDS
from leasework.queues import parse_queues
from leasework.redisconn import RedisTarget, RedisURLError, check_url

LOG_LEVELS = ("debug", "info", "warning", "error")

DEFAULT_OPS_ADDR = {
    "api": "127.0.0.1:8080",
    "worker": "127.0.0.1:9101",
    "relay": "127.0.0.1:9102",
    "dev": "127.0.0.1:8080",  # where the api answers, so the CLI and the client find it
    "migrate": "",
}
# roles that run the user's job types, and so need LEASEWORK_APP
APP_ROLES = ("api", "worker", "dev")


# LEASEWORK_DOCTOR_ALLOW: start-up checks whose failure a process starts past (leasework.preflight)
DOCTOR_ALLOW_ALL = "all"
DOCTOR_SINGLE_REPLICA = "single-replica"  # the Kafka replication checks, as doctor's flag
DOCTOR_CHECK_ROOTS = ("kafka", "redis", "postgres")  # every check's name starts with one


# a plain TTL lease: no fence condition on the terminal write, no deadline scope; for the
# fencing demonstration and the chaos harness's "can it fail" run only
UNSAFE_LEASE_MODE = "unsafe-plain-ttl"
# the scheduler's fire pass without its row lock, its compare-and-set and the tick
# constraint's hold on the job insert; for the chaos harness's "can it fail" run only
UNSAFE_SCHEDULER_VARIABLE = "LEASEWORK_UNSAFE_SCHEDULER"
UNSAFE_SCHEDULER_CONFIRMATION = "LEASEWORK_I_ACCEPT_DOUBLE_TICKS"


class ConfigError(ValueError):
    """A LEASEWORK_* variable holds a value the process cannot use."""


# librdkafka properties passed to every Kafka client leasework makes (producer, consumer,
# admin): LEASEWORK_RDKAFKA_SASL_MECHANISM=SCRAM-SHA-512 is sasl.mechanism (each _ a dot; __
# a literal underscore). What the promise rests on cannot be changed this way.
RDKAFKA_PREFIX = "LEASEWORK_RDKAFKA_"
RDKAFKA_FIXED = frozenset(
    {
        "bootstrap.servers",  # LEASEWORK_KAFKA_BROKERS
        "acks",
        "enable.idempotence",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "group.id",  # LEASEWORK_CONSUMER_GROUP
        "auto.offset.reset",
        "isolation.level",
    }
)

# every variable load() reads, by suffix: the keys a configuration file may hold (lower case)
SETTING_VARIABLES = (
    "PROCESS_NAME",
    "LOG_LEVEL",
    "OPS_ADDR",
    "POSTGRES_DSN",
    "REDIS_ADDR",
    "REDIS_URL",
    "REDIS_CA",
    "REDIS_SENTINELS",
    "REDIS_SENTINEL_MASTER",
    "REDIS_SENTINEL_PASSWORD",
    "KAFKA_BROKERS",
    "LEASE_MODE",
    "I_ACCEPT_DUPLICATE_EFFECTS",
    "PROMETHEUS_URL",
    "TRUSTED_PROXIES",
    "INTERNAL_ADDR",
    "CONSUMER_GROUP",
    "QUEUES",
    "WORKER_WAKEUPS",
    "APP",
    "DOCTOR_ALLOW",
    "PROCESS_LANE_START",
)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(name: str, raw: str) -> float:
    """Parse ``20s``, ``500ms``, ``1.5m``, ``7d`` or a bare number of seconds into seconds."""
    match = _DURATION.match(raw)
    if not match:
        raise ConfigError(
            f"{name}={raw!r} is not a duration; use a number of seconds or a value like "
            "'500ms', '20s', '2m', '7d'"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


NEVER = ("never", "forever", "off")


def parse_positive_duration(name: str, raw: str, *, allow_never: bool = False) -> float | None:
    """A duration above zero; with ``allow_never``, ``never`` (None: for ever) as well."""
    if allow_never and raw.lower() in NEVER:
        return None
    seconds = parse_duration(name, raw)
    if seconds <= 0:
        also = ", or 'never' to keep those rows for ever" if allow_never else ""
        raise ConfigError(f"{name}={raw!r} must be greater than zero{also}")
    return seconds


def parse_addr(name: str, raw: str) -> tuple[str, int]:
    """Parse ``host:port`` (host may be empty, meaning all interfaces)."""
    host, sep, port = raw.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{name}={raw!r} is not host:port (for example 127.0.0.1:9101)")
    return (host or "0.0.0.0"), int(port)


def parse_networks(
    name: str, raw: str
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """``127.0.0.1, 10.0.0.0/8, ::1``: addresses or networks, comma-separated."""
    networks = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ConfigError(
                f"{name}: {part!r} is not an IP address or network (for example 127.0.0.1 or "
                "10.0.0.0/8)"
            ) from None
    return tuple(networks)


def parse_int(name: str, raw: str, minimum: int, maximum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if not minimum <= value <= maximum:
        raise ConfigError(f"{name}={value} is out of range; use {minimum}..{maximum}")
    return value


def parse_bool(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use true or false")


@dataclass(frozen=True)
class Settings:
    role: str
    process_name: str
    log_level: str = "info"
    ops_addr: tuple[str, int] | None = None
    postgres_dsn: str = "postgresql://leasework:leasework@127.0.0.1:15432/leasework"
    # Redis: a redis:// or rediss:// URL (LEASEWORK_REDIS_ADDR=host:port is its short form),
    # a CA for rediss://, and Sentinels that name the primary (leasework.redisconn)
    redis_url: str = "redis://127.0.0.1:16379/0"
    redis_ca: str | None = None
    redis_sentinels: tuple[str, ...] = ()
    redis_sentinel_master: str = "leasework"
    redis_sentinel_password: str | None = None
    kafka_brokers: tuple[str, ...] = ("127.0.0.1:19092", "127.0.0.1:29092", "127.0.0.1:39092")
    shutdown_timeout: float = 20.0
    # worker
    # handlers in flight per worker; they hold no database connection (the completer and the
    # heartbeat write for all of them), so this is cheap to raise
    worker_concurrency: int = 64
    # the lanes handlers run in (leasework.lanes): how many run at once in each per worker;
    # the process lane's children are recycled after that many jobs or past that peak
    # memory (0: never), and started by "spawn" or "forkserver" (never "fork")
    thread_lane_capacity: int = 16
    asyncio_lane_capacity: int = 100
    process_lane_capacity: int = 2
    process_lane_max_jobs: int = 0
    process_lane_max_memory_mb: int = 0
    process_lane_start: str = "spawn"
    lease_ttl: float = 10.0
    # "fenced" (always, unless the unsafe demo mode is asked for explicitly, see load())
    lease_mode: str = "fenced"
    consumer_group: str = "leasework-workers"
    # the queues a worker serves (None: default and every queue its app's types name)
    queues: tuple[str, ...] | None = None
    # a worker whose queue is quiet claims a lone job when Postgres says it is ready, before
    # Kafka delivers it (leasework.worker.wakeup); off: Kafka alone wakes workers
    worker_wakeups: bool = True
    # relay
    relay_batch_size: int = 1000
    relay_tick: float = 0.5
    # retries
    retry_base: float = 1.0
    retry_cap: float = 300.0
    default_max_attempts: int = 5
    default_timeout_seconds: int = 300
    # api
    max_body_bytes: int = 1_048_576
    max_batch_bytes: int = 16 * 1_048_576
    topic_ready: str = "jobs.ready"
    topic_dlq: str = "jobs.dlq"
    # api, worker, dev: the user's job types, ``module:attribute[,module:attribute]``
    app: str | None = None
    # relay: how long finished jobs are kept (None: for ever)
    retain_succeeded: float | None = 7 * 86400.0
    retain_dead: float | None = 30 * 86400.0
    retain_cancelled: float | None = 7 * 86400.0
    # relay: how long audit entries and Alertmanager's notifications are kept (None: for ever)
    retain_audit: float | None = 90 * 86400.0
    retain_alerts: float | None = 30 * 86400.0
    # relay: how long a schedule's recorded ticks are kept (None: for ever)
    retain_ticks: float | None = 30 * 86400.0
    # relay: seconds added to the scheduler's clock; only the chaos harness sets it, to run a
    # relay whose clock is off (LEASEWORK_FAKE_CLOCK_OFFSET, -3600 to 3600)
    fake_clock_offset: float = 0.0
    # relay: the UNSAFE fire pass (LEASEWORK_UNSAFE_SCHEDULER, refused without
    # LEASEWORK_I_ACCEPT_DOUBLE_TICKS=yes); only the chaos harness sets it, to show that two
    # schedulers without the guards fire a tick twice
    unsafe_scheduler: bool = False
    prune_interval: float = 60.0
    # relay: the auditor (leasework.relay.auditor): seconds between passes (None: off), how
    # far past its lease a running job may be, how long a published job may wait unstarted
    audit_interval: float | None = 5.0
    audit_lease_grace: float = 60.0
    audit_stuck_after: float = 900.0
    # relay: the recovery of lost Kafka records (leasework.relay.recovery): seconds a
    # published job waits unstarted before it is watched (None: off; only the chaos harness's
    # unsafe twins turn it off), and the age at which a watch whose consumer group cannot be
    # read is judged lost all the same (kept under audit_stuck_after)
    recovery_after: float | None = 10.0
    recovery_fallback: float = 600.0
    # worker, relay: seconds between two reads of the ids of the topics consumed (worker) or
    # published to (relay), which tell a topic deleted and made again under a client that
    # librdkafka does not move to the new one (leasework.worker.topic_watch, the relay's
    # BlockingPublisher; None: never: only the chaos harness's unsafe twin turns it off)
    topic_check_every: float | None = 10.0
    # api: the Prometheus the console's overview asks for throughput, delay, budget and alerts
    prometheus_url: str = "http://127.0.0.1:9090"
    # api: what one request may cost, besides the two body caps above (leasework.api.limits)
    max_webhook_bytes: int = 262_144
    max_form_bytes: int = 8_192
    max_small_body_bytes: int = 65_536
    body_read_timeout: float = 10.0
    # api: the peers whose X-Forwarded-Proto is believed (a TLS-terminating proxy in front)
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    # api: a second, internal listener for /metrics and the detailed /readyz; when set, the
    # api port serves neither /metrics nor dependency errors
    internal_addr: tuple[str, int] | None = None
    # every Kafka client: further librdkafka properties (LEASEWORK_RDKAFKA_*), e.g. SASL, TLS
    kafka_properties: tuple[tuple[str, str], ...] = ()
    # api, relay, worker, dev: start-up checks whose failure the process starts past, logged
    # and shown (check names, dotted prefixes of them, single-replica or all)
    doctor_allow: tuple[str, ...] = ()

    @property
    def redis(self) -> RedisTarget:
        return RedisTarget(
            url=self.redis_url,
            ca_file=self.redis_ca,
            sentinels=tuple(
                (host, int(port))
                for host, _, port in (s.rpartition(":") for s in self.redis_sentinels)
            ),
            sentinel_master=self.redis_sentinel_master,
            sentinel_password=self.redis_sentinel_password,
        )


# variable -> (attribute, whether "never" is allowed)
DURATIONS: dict[str, tuple[str, bool]] = {
    "SHUTDOWN_TIMEOUT": ("shutdown_timeout", False),
    "LEASE_TTL": ("lease_ttl", False),
    "RELAY_TICK": ("relay_tick", False),
    "RETRY_BASE": ("retry_base", False),
    "RETRY_CAP": ("retry_cap", False),
    "PRUNE_INTERVAL": ("prune_interval", False),
    "AUDIT_INTERVAL": ("audit_interval", True),
    "AUDIT_LEASE_GRACE": ("audit_lease_grace", False),
    "AUDIT_STUCK_AFTER": ("audit_stuck_after", False),
    "RECOVERY_AFTER": ("recovery_after", True),
    "RECOVERY_FALLBACK": ("recovery_fallback", False),
    "TOPIC_CHECK_EVERY": ("topic_check_every", True),
    "RETAIN_SUCCEEDED": ("retain_succeeded", True),
    "RETAIN_DEAD": ("retain_dead", True),
    "RETAIN_CANCELLED": ("retain_cancelled", True),
    "RETAIN_AUDIT": ("retain_audit", True),
    "RETAIN_ALERTS": ("retain_alerts", True),
    "RETAIN_TICKS": ("retain_ticks", True),
    "BODY_READ_TIMEOUT": ("body_read_timeout", False),
}
# variable -> (attribute, lowest, highest)
INTEGERS: dict[str, tuple[str, int, int]] = {
    "WORKER_CONCURRENCY": ("worker_concurrency", 1, 1024),
    "RELAY_BATCH_SIZE": ("relay_batch_size", 1, 10_000),
    "DEFAULT_MAX_ATTEMPTS": ("default_max_attempts", 1, MAX_ATTEMPTS),
    "DEFAULT_TIMEOUT_SECONDS": ("default_timeout_seconds", 1, MAX_TIMEOUT_SECONDS),
    "MAX_BODY_BYTES": ("max_body_bytes", 1024, 64 * 1_048_576),
    "MAX_BATCH_BYTES": ("max_batch_bytes", 1024, 256 * 1_048_576),
    "MAX_WEBHOOK_BYTES": ("max_webhook_bytes", 1024, 64 * 1_048_576),
    "MAX_FORM_BYTES": ("max_form_bytes", 1024, 1_048_576),
    "MAX_SMALL_BODY_BYTES": ("max_small_body_bytes", 1024, 16 * 1_048_576),
    "THREAD_LANE_CAPACITY": ("thread_lane_capacity", 1, 1024),
    "ASYNCIO_LANE_CAPACITY": ("asyncio_lane_capacity", 1, 100_000),
    "PROCESS_LANE_CAPACITY": ("process_lane_capacity", 1, 256),
    "PROCESS_LANE_MAX_JOBS": ("process_lane_max_jobs", 0, 10_000_000),
    "PROCESS_LANE_MAX_MEMORY_MB": ("process_lane_max_memory_mb", 0, 1_048_576),
}


Getter = Callable[[str], str | None]


def load(role: str, environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings of ``role`` from ``environ`` (default: the process environment) and
    the TOML file ``LEASEWORK_CONFIG`` names, if any; a variable wins over the file."""
    env = merged_environment(os.environ if environ is None else environ)

    def get(suffix: str) -> str | None:
        value = env.get(f"LEASEWORK_{suffix}")
        return value if value is None else value.strip()

    values: dict[str, object] = {"role": role}
    values["process_name"] = get("PROCESS_NAME") or role

    level = (get("LOG_LEVEL") or "info").lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"LEASEWORK_LOG_LEVEL={level!r} is not one of {', '.join(LOG_LEVELS)}")
    values["log_level"] = level

    ops = get("OPS_ADDR")
    if ops is None:
        ops = DEFAULT_OPS_ADDR.get(role, "")
    values["ops_addr"] = parse_addr("LEASEWORK_OPS_ADDR", ops) if ops else None

    values.update(_dependencies(get))
    values["kafka_properties"] = kafka_properties(env)
    for suffix, (attr, allow_never) in DURATIONS.items():
        if (raw := get(suffix)) is not None:
            values[attr] = parse_positive_duration(
                f"LEASEWORK_{suffix}", raw, allow_never=allow_never
            )
    for suffix, (attr, low, high) in INTEGERS.items():
        if (raw := get(suffix)) is not None:
            values[attr] = parse_int(f"LEASEWORK_{suffix}", raw, low, high)
    values["lease_mode"] = _lease_mode(get)
    if (start := get("PROCESS_LANE_START")) is not None:
        if start not in ("spawn", "forkserver"):
            raise ConfigError(
                f"LEASEWORK_PROCESS_LANE_START={start!r} is not 'spawn' or 'forkserver' (the "
                "process lane never forks: the worker has threads and librdkafka's state)"
            )
        values["process_lane_start"] = start
    if (offset := get("FAKE_CLOCK_OFFSET")) is not None:
        values["fake_clock_offset"] = _clock_offset(offset)
    values["unsafe_scheduler"] = _unsafe_scheduler(get)
    values.update(_api_options(get))
    if (group := get("CONSUMER_GROUP")) is not None:
        values["consumer_group"] = group
    if (served := get("QUEUES")) is not None:
        try:
            values["queues"] = parse_queues(served)
        except ValueError as exc:
            raise ConfigError(f"LEASEWORK_QUEUES: {exc}") from None
    if (wakeups := get("WORKER_WAKEUPS")) is not None:
        values["worker_wakeups"] = parse_bool("LEASEWORK_WORKER_WAKEUPS", wakeups)
    if role in APP_ROLES:
        values["app"] = _app(role, get("APP"))
    if (allow := get("DOCTOR_ALLOW")) is not None:
        values["doctor_allow"] = parse_doctor_allow(allow)
    settings = Settings(**values)  # type: ignore[arg-type]
    _check_recovery_bound(settings)
    return settings


def _check_recovery_bound(settings: Settings) -> None:
    """The auditor's stuck bound must stay longer than the recovery's worst case (its wait
    before watching plus its fallback), or it pages on jobs recovery would have saved."""
    if settings.recovery_after is None or settings.audit_interval is None:
        return
    worst = settings.recovery_after + settings.recovery_fallback
    if settings.audit_stuck_after <= worst:
        raise ConfigError(
            f"LEASEWORK_AUDIT_STUCK_AFTER={settings.audit_stuck_after:g} s is not longer than "
            f"the recovery of lost Kafka records may take ({worst:g} s: "
            "LEASEWORK_RECOVERY_AFTER plus LEASEWORK_RECOVERY_FALLBACK); raise it, or lower "
            "those, so the auditor pages only on jobs recovery could not save"
        )


def _clock_offset(raw: str) -> float:
    try:
        offset = float(raw)
    except ValueError:
        offset = float("nan")
    if not -3600 <= offset <= 3600:
        raise ConfigError(
            f"LEASEWORK_FAKE_CLOCK_OFFSET={raw!r} is not a number of seconds from -3600 to "
            "3600 (the chaos harness's skewed clock; leave it unset in production)"
        )
    return offset


def _unsafe_scheduler(get: Getter) -> bool:
    raw = get("UNSAFE_SCHEDULER")
    if raw is None or not parse_bool(UNSAFE_SCHEDULER_VARIABLE, raw):
        return False
    if get("I_ACCEPT_DOUBLE_TICKS") != "yes":
        raise ConfigError(
            f"{UNSAFE_SCHEDULER_VARIABLE}={raw} turns off the scheduler's row lock, its "
            "compare-and-set and the unique tick's hold on the job insert, so two relays WILL "
            "fire a schedule's tick twice; it exists only to show that the chaos checker "
            f"catches it. Set {UNSAFE_SCHEDULER_CONFIRMATION}=yes as well to run it."
        )
    return True


def _dependencies(get: Getter) -> dict[str, object]:
    """Where Postgres, Redis and Kafka are."""
    values: dict[str, object] = {}
    if (dsn := get("POSTGRES_DSN")) is not None:
        if not dsn.startswith(("postgresql://", "postgres://")) and "=" not in dsn:
            raise ConfigError(
                f"LEASEWORK_POSTGRES_DSN={dsn!r} is neither a postgresql:// URL nor a "
                "key=value connection string"
            )
        values["postgres_dsn"] = dsn
    values.update(_redis(get))
    if (brokers := get("KAFKA_BROKERS")) is not None:
        listed = tuple(b.strip() for b in brokers.split(",") if b.strip())
        if not listed:
            raise ConfigError("LEASEWORK_KAFKA_BROKERS is empty; list host:port,host:port")
        for broker in listed:
            parse_addr("LEASEWORK_KAFKA_BROKERS", broker)
        values["kafka_brokers"] = listed
    return values


def _redis(get: Getter) -> dict[str, object]:
    """Where Redis is: a URL (or its short form, host:port), a CA, Sentinels."""
    values: dict[str, object] = {}
    url, short = get("REDIS_URL"), get("REDIS_ADDR")
    if url is not None and short is not None:
        raise ConfigError(
            "LEASEWORK_REDIS_URL and LEASEWORK_REDIS_ADDR are both set; set only "
            "LEASEWORK_REDIS_URL (LEASEWORK_REDIS_ADDR=host:port is its short form)"
        )
    if short is not None:
        host, port = parse_addr("LEASEWORK_REDIS_ADDR", short)
        url = f"redis://{host}:{port}/0"
    if url is not None:
        try:
            values["redis_url"] = check_url(url)
        except RedisURLError as exc:
            raise ConfigError(f"LEASEWORK_REDIS_URL: {masked(str(exc))}") from None
    if (ca := get("REDIS_CA")) is not None:
        if not os.path.isfile(ca):
            raise ConfigError(
                f"LEASEWORK_REDIS_CA={ca!r} is not a file; name the PEM file of the CA that "
                "signed Redis's certificate"
            )
        values["redis_ca"] = ca
    if sentinels := get("REDIS_SENTINELS"):
        listed = tuple(s.strip() for s in sentinels.split(",") if s.strip())
        for sentinel in listed:
            parse_addr("LEASEWORK_REDIS_SENTINELS", sentinel)
        values["redis_sentinels"] = listed
    if master := get("REDIS_SENTINEL_MASTER"):
        values["redis_sentinel_master"] = master
    if password := get("REDIS_SENTINEL_PASSWORD"):
        values["redis_sentinel_password"] = password
    return values


def _lease_mode(get: Getter) -> str:
    mode = get("LEASE_MODE") or "fenced"
    if mode not in ("fenced", UNSAFE_LEASE_MODE):
        raise ConfigError(f"LEASEWORK_LEASE_MODE={mode!r} is not 'fenced'")
    if mode == UNSAFE_LEASE_MODE and get("I_ACCEPT_DUPLICATE_EFFECTS") != "yes":
        raise ConfigError(
            f"LEASEWORK_LEASE_MODE={UNSAFE_LEASE_MODE} turns off the fence condition and the "
            "lease deadline, so a stalled worker WILL apply effects twice; it exists only to "
            "demonstrate that. Set LEASEWORK_I_ACCEPT_DUPLICATE_EFFECTS=yes as well to run it."
        )
    return mode


def _api_options(get: Getter) -> dict[str, object]:
    """The console's Prometheus, the proxies trusted for client addresses, the internal
    listener."""
    values: dict[str, object] = {}
    if (prometheus := get("PROMETHEUS_URL")) is not None:
        if not re.match(r"^https?://[^/\s]+", prometheus):
            raise ConfigError(
                f"LEASEWORK_PROMETHEUS_URL={prometheus!r} is not an http:// or https:// URL "
                "(for example http://127.0.0.1:9090)"
            )
        values["prometheus_url"] = prometheus.rstrip("/")
    if (proxies := get("TRUSTED_PROXIES")) is not None:
        values["trusted_proxies"] = parse_networks("LEASEWORK_TRUSTED_PROXIES", proxies)
    if internal := get("INTERNAL_ADDR"):
        values["internal_addr"] = parse_addr("LEASEWORK_INTERNAL_ADDR", internal)
    return values


def _app(role: str, app: str | None) -> str:
    if not app:
        raise ConfigError(
            f"LEASEWORK_APP is not set: the {role} needs your app to know your job types. "
            "Pass --app mypkg.jobs:app or set LEASEWORK_APP=mypkg.jobs:app (the demo app "
            "with noop, sleep, fail, ledger and echo is leasework.demo:app)"
        )
    return app


_CHECK_NAME = re.compile(r"^[a-z_]+(\.[A-Za-z0-9_.-]+)*$")


def parse_doctor_allow(raw: str) -> tuple[str, ...]:
    """``kafka.replication, postgres.synchronous_commit``: the checks a process may start
    past; each entry a check's name or a dotted prefix of names (``kafka.min_insync``),
    ``single-replica`` or ``all``."""
    entries = tuple(part.strip() for part in raw.split(",") if part.strip())
    for entry in entries:
        if entry in (DOCTOR_ALLOW_ALL, DOCTOR_SINGLE_REPLICA):
            continue
        if not _CHECK_NAME.match(entry) or entry.split(".")[0] not in DOCTOR_CHECK_ROOTS:
            raise ConfigError(
                f"LEASEWORK_DOCTOR_ALLOW: {entry!r} names no start-up check; list check names "
                "as `leasework doctor` prints them (postgres.synchronous_commit, "
                f"kafka.replication.jobs.ready, or a prefix such as kafka.replication), "
                f"{DOCTOR_SINGLE_REPLICA} or {DOCTOR_ALLOW_ALL}"
            )
    return entries


def known_keys() -> tuple[str, ...]:
    """The keys a configuration file may hold: every ``LEASEWORK_*`` suffix, in lower case."""
    return tuple(s.lower() for s in (*SETTING_VARIABLES, *DURATIONS, *INTEGERS))


def read_file(path: str) -> dict[str, str]:
    """A TOML configuration file as ``LEASEWORK_*`` variables. Its keys are the variables'
    suffixes in lower case (``postgres_dsn``, ``lease_ttl``); values are strings, numbers,
    booleans or, for lists (``kafka_brokers``, ``trusted_proxies``), arrays of strings."""
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"LEASEWORK_CONFIG={path!r} cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"LEASEWORK_CONFIG={path!r} is not valid TOML: {exc}") from None
    allowed = set(known_keys())
    unknown = sorted(k for k in set(data) - allowed if not k.startswith("rdkafka_"))
    if unknown:
        raise ConfigError(
            f"{path}: unknown key(s) {', '.join(unknown)}; a configuration file holds "
            f"{', '.join(sorted(allowed))} and rdkafka_* (librdkafka properties)"
        )
    variables = {}
    for key, value in data.items():
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            text = ",".join(value)
        elif isinstance(value, bool):
            text = "yes" if value else "no"
        elif isinstance(value, str | int | float):
            text = str(value)
        else:
            raise ConfigError(f"{path}: {key} must be a string, a number or a list of strings")
        variables[f"LEASEWORK_{key.upper()}"] = text
    return variables


def merged_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` over the file ``LEASEWORK_CONFIG`` names (the variables win)."""
    path = (environ.get("LEASEWORK_CONFIG") or "").strip()
    return {**(read_file(path) if path else {}), **environ}


def masked(value: str) -> str:
    """``value`` with any password in it hidden: a URL's ``user:password@``, a key=value
    connection string's ``password=...``."""
    value = re.sub(r"(://[^:/@\s]*:)[^@\s]+@", r"\1***@", value)
    return re.sub(r"\b(password|sslpassword)=('[^']*'|\S+)", r"\1=***", value)


def masked_property(name: str, value: str) -> str:
    """A librdkafka property's value for printing: a password or key hidden."""
    return "***" if re.search(r"password|secret|key\.pem|keystore", name) else value


def effective(role: str, environ: Mapping[str, str] | None = None) -> list[tuple[str, str, str]]:
    """Every setting of ``role`` as (name, value with secrets masked, where it came from:
    ``env``, the file, or ``default``), for ``leasework config``."""
    env = os.environ if environ is None else environ
    path = (env.get("LEASEWORK_CONFIG") or "").strip()
    from_file = read_file(path) if path else {}
    settings = load(role, env)
    rows = []
    for field_ in fields(Settings):
        variable = f"LEASEWORK_{field_.name.upper()}"
        if field_.name == "role":
            source = "argument"
        elif variable in env:
            source = "env"
        else:
            source = path if variable in from_file else "default"
        value = getattr(settings, field_.name)
        if field_.name == "redis_url" and "LEASEWORK_REDIS_ADDR" in env:
            source = "env"
        elif field_.name == "redis_url" and "LEASEWORK_REDIS_ADDR" in from_file:
            source = path
        if field_.name.endswith("password") and value:
            value = "***"
        if isinstance(value, tuple) and field_.name in ("ops_addr", "internal_addr"):
            value = f"{value[0]}:{value[1]}"
        elif field_.name == "kafka_properties":
            value = ",".join(f"{k}={masked_property(k, v)}" for k, v in value)
            source = "env" if any(v.startswith(RDKAFKA_PREFIX) for v in env) else source
        elif isinstance(value, tuple):
            value = ",".join(str(v) for v in value)
        text = "" if value is None else masked(str(value))
        rows.append((field_.name, text, source))
    return rows


def rdkafka_property(variable: str) -> str:
    """The librdkafka property a ``LEASEWORK_RDKAFKA_*`` variable sets."""
    suffix = variable[len(RDKAFKA_PREFIX) :].lower()
    return ".".join(part.replace("\0", "_") for part in suffix.replace("__", "\0").split("_"))


def kafka_properties(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The librdkafka properties ``environ`` passes through, sorted; refuses one that would
    change what the promise rests on."""
    found = {}
    for variable, value in environ.items():
        if not variable.startswith(RDKAFKA_PREFIX) or variable == RDKAFKA_PREFIX:
            continue
        name = rdkafka_property(variable)
        if name in RDKAFKA_FIXED:
            raise ConfigError(
                f"{variable} would set {name}, which leasework fixes (the promise rests on it, "
                "or another variable sets it); remove it"
            )
        found[name] = value.strip()
    return tuple(sorted(found.items()))
