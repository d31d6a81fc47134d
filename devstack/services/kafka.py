"""Kafka 4.1 KRaft nodes (``kafka-1..3``), each ``process.roles=broker,controller``.

Listeners per node N (ports from :func:`layout.kafka_ports`):

* ``BROKER``     N9093 inter-broker, direct (also what the supervisor's admin client uses)
* ``CONTROLLER`` N9094 KRaft quorum, direct (static ``controller.quorum.voters``)
* ``EXTERNAL``   N9095 api and relay; *advertised as the toxiproxy address* N9092
  (proxy ``kafka-N``)
* ``WORKER_1``   N9096 worker-1; *advertised as the toxiproxy address* N9097 (proxy
  ``kafka-N-worker-1``)
* ``WORKER_2``   N9098 worker-2; *advertised as the toxiproxy address* N9099 (proxy
  ``kafka-N-worker-2``)
* ``SECURE``     N9100 SASL_SSL (SCRAM-SHA-512 and PLAIN) with the stack's certificate, for
  every leasework process in secure mode (``devstack.tls``); *advertised as the toxiproxy
  address* N9101 (proxy ``kafka-N-secure``). The SCRAM user is made through the admin API once
  the cluster is up (:func:`kafka_admin.ensure_scram_user`); the PLAIN user is in the
  listener's JAAS configuration.

A broker answers a client with the advertised addresses of the listener the client came in
through, so every byte between leasework and a broker crosses a proxy, and each worker's
link can be cut apart from the other worker's, the relay's and the api's.

A running node whose rendered ``server.properties`` differs from the one it was started
with is reported by :meth:`KafkaNode.config_stale`; ``Stack.up`` restarts such nodes one at
a time (a listener change needs a restart, never a reformat).

All three nodes are formatted once with one cluster id, generated on first use and kept
in ``<state>/kafka-cluster-id``; a node is formatted only while its log dir has no
``meta.properties``. The JVM logs through log4j2 to stdout, which is the node's log file.
"""

from __future__ import annotations

import base64
import threading
import uuid
from pathlib import Path

from .. import procs, tls, tools
from ..errors import StackError
from ..layout import (
    HOST,
    KAFKA_NODE_IDS,
    KAFKA_QUORUM_VOTERS,
    KAFKA_SECURE_PASSWORD,
    KAFKA_SECURE_USER,
    KAFKA_WORKERS,
    Layout,
    addr,
    kafka_ports,
    kafka_worker_listener,
)
from . import kafka_admin
from .base import Service

# Three brokers share two cores with everything else. Each JVM is told it has one CPU, so it
# sizes its GC, JIT compiler and common-pool threads for one; the serial collector has no
# concurrent GC threads at all (young collections of a heap this size take a few ms); the
# heap is fixed, so it never resizes. The JIT stops at C1: C2's compiles cost a fresh broker
# more CPU than its faster code saves it here (docs/design-decisions.md, "Kafka brokers are
# sized for one CPU each": about a quarter less broker CPU per job on a fresh stack, the same
# once warm).
JVM_OPTS = [
    "-Xms384m",
    "-Xmx384m",
    "-XX:ActiveProcessorCount=1",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
]

# Loggers that are noisy at INFO and rarely needed to debug the stack.
QUIET_LOGGERS = [
    "org.apache.kafka.common.config.AbstractConfig",
    "org.apache.kafka.common.utils.AppInfoParser",
    "org.apache.kafka.clients",
    "org.apache.kafka.common.network",
    "org.apache.kafka.common.metrics",
    "org.apache.kafka.storage.internals.log",
    "org.apache.kafka.image",
    "org.apache.kafka.metadata",
    "org.apache.kafka.server.metrics",
    "kafka.log.LogCleaner",
    "kafka.log.LogManager",
    "kafka.cluster.Partition",
    "kafka.server.ReplicaFetcherManager",
    "kafka.server.ReplicaFetcherThread",
    "kafka.server.metadata",
    "kafka.request.logger",
    "state.change.logger",
]


def new_cluster_id() -> str:
    """A Kafka Uuid in its base64url form (22 chars), not starting with '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def secure_listener_properties(tls_dir: Path) -> dict[str, object]:
    """The ``SECURE`` listener's TLS and SASL settings (pure)."""
    prefix = "listener.name.secure"
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    plain = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'user_{KAFKA_SECURE_USER}="{KAFKA_SECURE_PASSWORD}";'
    )
    return {
        f"{prefix}.ssl.keystore.type": "PEM",
        f"{prefix}.ssl.keystore.location": str(tls_dir / "server-bundle.pem"),
        f"{prefix}.sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN",
        f"{prefix}.scram-sha-512.sasl.jaas.config": scram,
        f"{prefix}.plain.sasl.jaas.config": plain,
    }


def render_server_properties(node_id: int, log_dir: Path, tls_dir: Path) -> str:
    """server.properties for one node (pure; unit-tested)."""
    p = kafka_ports(node_id)
    props: dict[str, object] = {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "controller.quorum.voters": KAFKA_QUORUM_VOTERS,
        "listeners": ",".join(
            [
                f"BROKER://{addr(p['broker'])}",
                f"CONTROLLER://{addr(p['controller'])}",
                f"EXTERNAL://{addr(p['external'])}",
                *(f"{kafka_worker_listener(w)}://{addr(p[w])}" for w in KAFKA_WORKERS),
                f"SECURE://{addr(p['secure'])}",
            ]
        ),
        "advertised.listeners": ",".join(
            [
                f"BROKER://{addr(p['broker'])}",
                f"EXTERNAL://{addr(p['proxy'])}",
                *(f"{kafka_worker_listener(w)}://{addr(p[f'{w}-proxy'])}" for w in KAFKA_WORKERS),
                f"SECURE://{addr(p['secure-proxy'])}",
            ]
        ),
        "listener.security.protocol.map": ",".join(
            [
                *(
                    f"{listener}:PLAINTEXT"
                    for listener in (
                        "BROKER",
                        "CONTROLLER",
                        "EXTERNAL",
                        *(kafka_worker_listener(w) for w in KAFKA_WORKERS),
                    )
                ),
                "SECURE:SASL_SSL",
            ]
        ),
        **secure_listener_properties(tls_dir),
        "inter.broker.listener.name": "BROKER",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": str(log_dir),
        "num.partitions": 3,
        "default.replication.factor": 3,
        "min.insync.replicas": 2,
        "offsets.topic.replication.factor": 3,
        "offsets.topic.num.partitions": 12,
        "transaction.state.log.replication.factor": 3,
        "transaction.state.log.min.isr": 2,
        "transaction.state.log.num.partitions": 12,
        "share.coordinator.state.topic.replication.factor": 3,
        "share.coordinator.state.topic.min.isr": 2,
        "group.initial.rebalance.delay.ms": 0,
        "auto.create.topics.enable": "false",
        # one thread per pool: batched producers and consumers make few, large requests
        "num.network.threads": 1,
        "num.io.threads": 2,
        "num.replica.fetchers": 1,
        # acks=all waits for the followers' fetch: any byte ends a follower's wait at once
        # (a larger replica.fetch.min.bytes would hold every acknowledgement), and an idle
        # follower long-polls for 500 ms (Kafka's defaults, written down)
        "replica.fetch.min.bytes": 1,
        "replica.fetch.wait.max.ms": 500,
        "num.recovery.threads.per.data.dir": 1,
        "background.threads": 2,
        # a week, as `leasework doctor` asks of every topic leasework uses (a shorter one
        # deletes a backlog that waits longer); checked every 5 s, so the chaos harness's
        # retention_shrink deletes a backlog within seconds (Kafka's default is 5 minutes)
        "log.retention.hours": 168,
        "log.retention.check.interval.ms": 5000,
        "log.segment.bytes": 64 * 1024 * 1024,
        "log.cleaner.threads": 1,
        "unclean.leader.election.enable": "false",
    }
    lines = [
        "# generated by devstack; edits are overwritten",
        # the JVM's options, so that changing them makes `up` restart the node as well
        f"# jvm: {' '.join(JVM_OPTS)}",
    ]
    lines += [f"{k}={v}" for k, v in props.items()]
    return "\n".join(lines) + "\n"


def render_log4j2(node_name: str) -> str:
    """log4j2 properties: INFO to stdout (= the node's log file), WARN for chatty loggers."""
    lines = [
        f"name = {node_name}",
        "status = warn",
        "appender.out.type = Console",
        "appender.out.name = STDOUT",
        "appender.out.target = SYSTEM_OUT",
        "appender.out.layout.type = PatternLayout",
        "appender.out.layout.pattern = [%d] %p %m (%c)%n",
        "rootLogger.level = INFO",
        "rootLogger.appenderRef.out.ref = STDOUT",
    ]
    for i, logger in enumerate(QUIET_LOGGERS):
        lines += [f"logger.q{i}.name = {logger}", f"logger.q{i}.level = WARN"]
    return "\n".join(lines) + "\n"


def read_meta_cluster_id(meta: Path) -> str | None:
    try:
        for line in meta.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "cluster.id":
                return value.strip() or None
    except FileNotFoundError:
        return None
    return None


_cluster_id_lock = threading.Lock()


def cluster_id(layout: Layout) -> str:
    """The one cluster id of the stack: stored, else taken from an already formatted
    node (the file was lost), else new. Thread-safe (nodes are formatted in parallel)."""
    with _cluster_id_lock:
        return _cluster_id(layout)


def _cluster_id(layout: Layout) -> str:
    path = layout.state_dir / "kafka-cluster-id"
    if path.exists():
        cid = path.read_text().strip()
        if cid:
            return cid
    found = (
        read_meta_cluster_id(layout.service_dir(f"kafka-{n}") / "data" / "meta.properties")
        for n in KAFKA_NODE_IDS
    )
    cid = next((c for c in found if c), None) or new_cluster_id()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(cid + "\n")
    tmp.replace(path)
    return cid


class KafkaNode(Service):
    stop_timeout = 30.0
    ready_timeout = 180.0

    def __init__(self, layout: Layout, node_id: int) -> None:
        super().__init__(layout)
        self.node_id = node_id
        self.name = f"kafka-{node_id}"

    @property
    def base_dir(self) -> Path:
        return self.layout.service_dir(self.name)

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def properties(self) -> Path:
        return self.base_dir / "server.properties"

    @property
    def log4j2(self) -> Path:
        return self.base_dir / "log4j2.properties"

    def ports(self) -> tuple[int, ...]:
        p = kafka_ports(self.node_id)
        return (
            p["broker"],
            p["controller"],
            p["external"],
            *(p[w] for w in KAFKA_WORKERS),
            p["secure"],
        )

    def address(self) -> str:
        p = kafka_ports(self.node_id)
        return ", ".join(
            [
                f"{addr(p['external'])} (proxy {addr(p['proxy'])})",
                *(f"{w} {addr(p[w])} (proxy {addr(p[f'{w}-proxy'])})" for w in KAFKA_WORKERS),
                f"secure {addr(p['secure'])} (proxy {addr(p['secure-proxy'])})",
            ]
        )

    def rendered_properties(self) -> str:
        return render_server_properties(self.node_id, self.data_dir, self.layout.tls_dir)

    def config_stale(self) -> bool:
        """The node's server.properties on disk (what the running node was started with:
        :meth:`prepare` writes it only before a start) differs from the current rendering."""
        try:
            current = self.properties.read_text()
        except FileNotFoundError:
            return True
        return current != self.rendered_properties()

    def stale(self, pid: int) -> list[str]:
        return ["server.properties"] if self.config_stale() else []

    def markers(self) -> tuple[str, ...]:
        return ("kafka.Kafka", str(self.properties))

    def _java(self) -> list[str]:
        libs = self.layout.kafka_libs
        if not any(libs.glob("kafka_2.13-*.jar")):
            raise StackError(f"{libs} has no Kafka jars; run `python -m devstack provision`")
        return [
            str(tools.require("java")),
            *JVM_OPTS,
            f"-Dlog4j2.configurationFile={self.log4j2}",
            "-cp",
            f"{libs}/*",
        ]

    def prepare(self) -> None:
        tls.ensure(self.layout)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.properties.write_text(self.rendered_properties())
        self.log4j2.write_text(render_log4j2(self.name))
        if (self.data_dir / "meta.properties").exists():
            return
        argv = [
            *self._java(),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id(self.layout),
            "-c",
            str(self.properties),
        ]
        log = self.layout.log(self.name)
        rc = procs.run_logged(argv, log, "format")
        if rc != 0:
            raise StackError(f"{self.name}: kafka-storage format failed (exit {rc})", log)

    def command(self) -> list[str]:
        return [*self._java(), "kafka.Kafka", str(self.properties)]

    def probe(self) -> bool:
        bootstrap = f"{HOST}:{kafka_ports(self.node_id)['broker']}"
        return self.node_id in kafka_admin.live_broker_ids(bootstrap)
