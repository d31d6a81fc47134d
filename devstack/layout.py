"""Where things live: the fixed port/address contract and the on-disk layout.

Other code (tests, the chaos harness, leasework's own defaults) depends on these
numbers; change them only together with everything that reads them.

State dir (``LEASEWORK_STATE_DIR``, default ``/var/tmp/leasework``; deliberately not
inside the repo, because CI clones into a 0700 directory the ``postgres`` user cannot
traverse)::

    logs/NAME.log  pids/NAME.pid  postgres/  redis/  kafka-N/  prometheus/
    alertmanager/  toxiproxy/  kafka-cluster-id  tls/  mode

Cache dir (``LEASEWORK_CACHE_DIR``, default ``~/.cache/leasework``)::

    kafka-4.1.1/libs/*.jar          kafka-4.1.1/.complete
    toxiproxy-2.12.0/toxiproxy-server   toxiproxy-2.12.0/.complete
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"

KAFKA_VERSION = "4.1.1"
TOXIPROXY_VERSION = "2.12.0"

POSTGRES_PORT = 15433
POSTGRES_PROXY_PORT = 15432
REDIS_PORT = 16380
REDIS_PROXY_PORT = 16379
# Redis's TLS port (the same server; the ACL user below) and its proxy
REDIS_TLS_PORT = 16382
REDIS_TLS_PROXY_PORT = 16381
TOXIPROXY_API_PORT = 8474
PROMETHEUS_PORT = 9090
ALERTMANAGER_PORT = 9093

KAFKA_NODE_IDS = (1, 2, 3)

PG_USER = "leasework"
PG_PASSWORD = "leasework"
PG_DATABASE = "leasework"

# the secured listeners' users (a throwaway local stack's: not secrets): Redis's ACL user,
# Kafka's SCRAM-SHA-512 user (also a PLAIN user with the same password)
REDIS_ACL_USER = "leasework"
REDIS_ACL_PASSWORD = "leasework-redis-secret"
KAFKA_SECURE_USER = "leasework"
KAFKA_SECURE_PASSWORD = "leasework-kafka-secret"


# Each worker reaches Kafka through a listener and proxies of its own, so one worker's Kafka
# link can be cut, slowed or reset while the other worker's (and the relay's) stay clean.
KAFKA_WORKERS: tuple[str, ...] = ("worker-1", "worker-2")


def kafka_worker_listener(worker: str) -> str:
    """The broker listener of one worker: ``worker-2`` -> ``WORKER_2``."""
    return worker.upper().replace("-", "_")


def kafka_ports(node_id: int) -> dict[str, int]:
    """Ports of one Kafka node N:

    * ``proxy``            N9092 toxiproxy ``kafka-N``, advertised by ``EXTERNAL`` (api, relay)
    * ``broker``           N9093 inter-broker listener, direct
    * ``controller``       N9094 KRaft quorum, direct
    * ``external``         N9095 client listener ``EXTERNAL``, upstream of ``kafka-N``
    * ``worker-1``         N9096 client listener ``WORKER_1``, upstream of ``kafka-N-worker-1``
    * ``worker-1-proxy``   N9097 toxiproxy ``kafka-N-worker-1``, advertised by ``WORKER_1``
    * ``worker-2``         N9098 client listener ``WORKER_2``, upstream of ``kafka-N-worker-2``
    * ``worker-2-proxy``   N9099 toxiproxy ``kafka-N-worker-2``, advertised by ``WORKER_2``
    * ``secure``           N9100 SASL_SSL listener ``SECURE``, upstream of ``kafka-N-secure``
    * ``secure-proxy``     N9101 toxiproxy ``kafka-N-secure``, advertised by ``SECURE``
    """
    base = node_id * 10000 + 9092
    ports = {
        "proxy": base,
        "broker": base + 1,
        "controller": base + 2,
        "external": base + 3,
    }
    for i, worker in enumerate(KAFKA_WORKERS):
        ports[worker] = base + 4 + 2 * i
        ports[f"{worker}-proxy"] = base + 5 + 2 * i
    ports["secure"] = base + 8
    ports["secure-proxy"] = base + 9
    return ports


def addr(port: int) -> str:
    return f"{HOST}:{port}"


POSTGRES_DSN = f"postgresql://{PG_USER}:{PG_PASSWORD}@{HOST}:{POSTGRES_PROXY_PORT}/{PG_DATABASE}"
POSTGRES_DIRECT_DSN = f"postgresql://{PG_USER}:{PG_PASSWORD}@{HOST}:{POSTGRES_PORT}/{PG_DATABASE}"
REDIS_ADDR = addr(REDIS_PROXY_PORT)
# What api and relay bootstrap from (toxiproxy kafka-N -> EXTERNAL listener).
KAFKA_BROKERS = ",".join(addr(kafka_ports(n)["proxy"]) for n in KAFKA_NODE_IDS)
# What each worker bootstraps from (toxiproxy kafka-N-worker-M -> its WORKER_M listener). A
# broker answers a client with the advertised addresses of the listener it came in through,
# so a worker stays on its own proxies for all its traffic and its link can be cut alone.
KAFKA_WORKER_BROKERS: dict[str, str] = {
    worker: ",".join(addr(kafka_ports(n)[f"{worker}-proxy"]) for n in KAFKA_NODE_IDS)
    for worker in KAFKA_WORKERS
}
# What every leasework process bootstraps from in secure mode (toxiproxy kafka-N-secure ->
# the SASL_SSL listener SECURE): one set of proxies for all, so in that mode one worker's
# Kafka link cannot be cut apart from the others'.
KAFKA_SECURE_BROKERS = ",".join(addr(kafka_ports(n)["secure-proxy"]) for n in KAFKA_NODE_IDS)
# Inter-broker listeners: a direct, proxy-free path into the cluster. The supervisor's own
# readiness checks and admin calls use it so that toxics never fool them.
KAFKA_DIRECT_BOOTSTRAP = ",".join(addr(kafka_ports(n)["broker"]) for n in KAFKA_NODE_IDS)
KAFKA_QUORUM_VOTERS = ",".join(f"{n}@{addr(kafka_ports(n)['controller'])}" for n in KAFKA_NODE_IDS)

# name -> (role, ops port). Started in this order after `migrate` has succeeded.
APPS: dict[str, tuple[str, int]] = {
    "api": ("api", 8080),
    "relay": ("relay", 9102),
    "worker-1": ("worker", 9101),
    "worker-2": ("worker", 9103),
}

# Relays beside the stack's own, name -> (role, ops port): never started by `up`; a chaos
# scenario that asks for them has the harness start them for its run and stop them after
# (two or three schedulers racing for the same ticks, one with its clock off).
EXTRA_RELAYS: dict[str, tuple[str, int]] = {
    "relay-2": ("relay", 9104),
    "relay-3": ("relay", 9105),
}

# Where the api answers, each worker's ops port (its /metrics), and the HTTP APIs of
# Toxiproxy, of the stack's long-lived Prometheus and of the Alertmanager every Prometheus
# of the stack (the long-lived one and the scratch ones) sends its alerts to.
API_URL = f"http://{HOST}:{APPS['api'][1]}"
WORKER_PORTS: dict[str, int] = {
    name: port for name, (role, port) in APPS.items() if role == "worker"
}
TOXIPROXY_URL = f"http://{HOST}:{TOXIPROXY_API_PORT}"
PROMETHEUS_URL = f"http://{HOST}:{PROMETHEUS_PORT}"
ALERTMANAGER_URL = f"http://{HOST}:{ALERTMANAGER_PORT}"
# Alertmanager's one receiver: the api's webhook, which records each notification
ALERT_WEBHOOK_URL = f"{API_URL}/alerts/webhook"
ALERT_RECEIVER = "leasework-api"

# The job types the stack's api and workers load (``LEASEWORK_APP``, which `just up` passes
# through when set): the demo types for tests, chaos and bench, and the example shop's.
STACK_APP = "leasework.demo:app,examples.shop.jobs:app"

# The example shop (``python -m examples.shop``): its web endpoint and its mail service.
SHOP_PORT = 8090
SHOP_MAIL_PORT = 8025
SHOP_URL = f"http://{HOST}:{SHOP_PORT}"
SHOP_MAIL_URL = f"http://{HOST}:{SHOP_MAIL_PORT}"

# toxiproxy name -> (listen port, upstream port)
PROXIES: dict[str, tuple[int, int]] = {
    "postgres": (POSTGRES_PROXY_PORT, POSTGRES_PORT),
    "redis": (REDIS_PROXY_PORT, REDIS_PORT),
    "redis-tls": (REDIS_TLS_PROXY_PORT, REDIS_TLS_PORT),
    **{f"kafka-{n}": (kafka_ports(n)["proxy"], kafka_ports(n)["external"]) for n in KAFKA_NODE_IDS},
    **{
        f"kafka-{n}-{worker}": (kafka_ports(n)[f"{worker}-proxy"], kafka_ports(n)[worker])
        for worker in KAFKA_WORKERS
        for n in KAFKA_NODE_IDS
    },
    **{
        f"kafka-{n}-secure": (kafka_ports(n)["secure-proxy"], kafka_ports(n)["secure"])
        for n in KAFKA_NODE_IDS
    },
}

KAFKA_TOPICS: dict[str, dict[str, object]] = {
    "jobs.ready": {"partitions": 12, "replication": 3, "config": {"min.insync.replicas": "2"}},
    "jobs.dlq": {"partitions": 3, "replication": 3, "config": {"min.insync.replicas": "2"}},
}


def default_repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Layout:
    """Directories the supervisor reads and writes. Pure paths; creating them is the
    caller's business (see :meth:`ensure_dirs`)."""

    state_dir: Path
    cache_dir: Path
    repo_root: Path

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Layout:
        env = dict(os.environ if env is None else env)
        state = env.get("LEASEWORK_STATE_DIR") or "/var/tmp/leasework"
        cache = env.get("LEASEWORK_CACHE_DIR") or str(Path("~/.cache/leasework").expanduser())
        return cls(Path(state).absolute(), Path(cache).absolute(), default_repo_root())

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def pids_dir(self) -> Path:
        return self.state_dir / "pids"

    def log(self, name: str) -> Path:
        return self.logs_dir / f"{name}.log"

    def pidfile(self, name: str) -> Path:
        return self.pids_dir / f"{name}.pid"

    def service_dir(self, name: str) -> Path:
        return self.state_dir / name

    @property
    def tokens_dir(self) -> Path:
        """API tokens ``just up`` creates: ``dev.token`` (admin, no rate limit; the CLI, the
        client, the tests, the bench and chaos read it) and ``alertmanager.token`` (scope
        ``alerts``, Alertmanager's webhook credentials file). Mode 0600."""
        return self.state_dir / "tokens"

    @property
    def dev_token_file(self) -> Path:
        return self.tokens_dir / "dev.token"

    @property
    def alertmanager_token_file(self) -> Path:
        return self.tokens_dir / "alertmanager.token"

    @property
    def tls_dir(self) -> Path:
        """The throwaway CA and the secured listeners' certificates (devstack.tls)."""
        return self.state_dir / "tls"

    @property
    def mode_file(self) -> Path:
        """``plain`` or ``secure``: which listeners leasework's own processes use (``up
        --secure`` / ``up --plain`` write it; ``up`` alone keeps it; absent: plain)."""
        return self.state_dir / "mode"

    def mode(self) -> str:
        try:
            return "secure" if self.mode_file.read_text().strip() == "secure" else "plain"
        except FileNotFoundError:
            return "plain"

    @property
    def kafka_libs(self) -> Path:
        return self.cache_dir / f"kafka-{KAFKA_VERSION}" / "libs"

    @property
    def toxiproxy_bin(self) -> Path:
        return self.cache_dir / f"toxiproxy-{TOXIPROXY_VERSION}" / "toxiproxy-server"

    @property
    def kafka_pom(self) -> Path:
        return Path(__file__).resolve().parent / "kafka" / "pom.xml"

    @property
    def proxies_json(self) -> Path:
        return self.repo_root / "toxiproxy" / "proxies.json"

    @property
    def rules_dir(self) -> Path:
        return self.repo_root / "dashboards" / "rules"

    def ensure_dirs(self) -> None:
        for d in (self.state_dir, self.logs_dir, self.pids_dir):
            d.mkdir(parents=True, exist_ok=True)
        # postgres runs unprivileged and must traverse the state dir.
        self.state_dir.chmod(0o755)
