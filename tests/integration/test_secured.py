"""The secured listeners of the stack (devstack.tls), reached the way a leasework process in
secure mode reaches them: each takes the right credentials and refuses wrong ones with a message
that says why, and leasework's own clients (leases, the rate limiter, doctor, a Kafka producer
and consumer) work over them. The last test runs only while the stack itself runs secured
(``just up --secure``; ``just test`` runs this module once more in that mode): a job goes
through the whole pipeline, and every connection of leasework's processes is a secured one."""

from __future__ import annotations

import subprocess
import time
import uuid
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
import redis
import trio
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from devstack.layout import (
    KAFKA_DIRECT_BOOTSTRAP,
    KAFKA_SECURE_BROKERS,
    PG_DATABASE,
    PG_PASSWORD,
    PG_USER,
    POSTGRES_DIRECT_DSN,
    POSTGRES_PROXY_PORT,
    REDIS_PORT,
    REDIS_TLS_PORT,
    REDIS_TLS_PROXY_PORT,
)
from devstack.procs import read_environ
from leasework import doctor, redisconn
from leasework.api.auth import RateLimiter
from leasework.doctor import OK, Options
from leasework.kafka import client_config
from leasework.lease import Leases
from leasework.tokens import Principal
from tests.integration.conftest import wait_status
from tests.integration.secured import secured_env, secured_settings

SCRATCH_TOPIC = "secured.roundtrip"


def other_ca(tmp_path: Path) -> str:
    """A CA that signed nothing of the stack's."""
    key, cert = tmp_path / "other.key", tmp_path / "other.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=other"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return str(cert)


# --- Postgres: sslmode=verify-full ----------------------------------------------------------


def test_postgres_verify_full_against_the_stack_ca(stack):
    dsn = secured_settings(stack).postgres_dsn
    assert "sslmode=verify-full" in dsn
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        ssl, version = conn.execute(
            "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        ).fetchone()
    assert ssl is True and version.startswith("TLSv1.")


def test_postgres_refuses_a_server_it_cannot_verify(stack, tmp_path):
    dsn = secured_settings(stack).postgres_dsn.rsplit("sslrootcert=", 1)[0]
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        psycopg.connect(dsn + f"sslrootcert={other_ca(tmp_path)}", connect_timeout=5)
    # the certificate names 127.0.0.1 and localhost, nothing else: the same server reached
    # under another name is refused
    ca = stack.layout.tls_dir / "ca.pem"
    wrong_name = (
        f"host=db.example hostaddr=127.0.0.1 port={POSTGRES_PROXY_PORT} user={PG_USER} "
        f"password={PG_PASSWORD} dbname={PG_DATABASE} sslmode=verify-full sslrootcert={ca}"
    )
    with pytest.raises(psycopg.OperationalError, match="does not match host name"):
        psycopg.connect(wrong_name, connect_timeout=5)


# --- Redis: TLS and the ACL user ------------------------------------------------------------


def test_redis_over_tls_as_the_acl_user(stack):
    client = redisconn.connect(secured_settings(stack).redis, timeout=5, decode_responses=True)
    try:
        assert client.ping()
        info = client.client_info()
        assert info["user"] == "leasework"
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.flushall()  # the ACL user cannot wipe what the leases rest on
    finally:
        client.close()


def test_redis_refuses_a_wrong_password_and_an_untrusted_certificate(stack, tmp_path):
    target = secured_settings(stack).redis
    wrong = replace(target, url=target.url.replace("-secret@", "-wrong@"))
    with pytest.raises(redis.AuthenticationError, match="invalid username-password"):
        redisconn.connect(wrong, timeout=5).ping()
    untrusted = replace(target, ca_file=other_ca(tmp_path))
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        redisconn.connect(untrusted, timeout=5).ping()
    plain_on_tls_port = redisconn.RedisTarget(f"redis://127.0.0.1:{REDIS_TLS_PROXY_PORT}/0")
    with pytest.raises(redis.ConnectionError):
        redisconn.connect(plain_on_tls_port, timeout=3).ping()


async def test_leases_and_the_rate_limiter_work_over_tls(stack):
    settings = secured_settings(stack)
    leases = Leases(settings.redis)
    job = uuid.uuid4()
    [claim] = await leases.claim_many([job], "secured-test", 5.0)
    assert claim is not None
    assert await leases.renew_many([claim], 5.0) == [True]
    assert await leases.release_many([claim]) == [True]
    limiter = RateLimiter(settings.redis)
    principal = Principal(str(uuid.uuid4()), "secured-test", frozenset({"jobs:submit"}), 1.0, 1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(limiter.run)
        assert await limiter.check(principal) is None
        retry_after = await limiter.check(principal)
        nursery.cancel_scope.cancel()
    assert retry_after is not None and retry_after > 0 and not limiter.degraded


# --- Kafka: SASL_SSL, SCRAM-SHA-512 and PLAIN -----------------------------------------------


@pytest.fixture(scope="module")
def scratch_topic(stack):
    admin = AdminClient({"bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP})
    if SCRATCH_TOPIC not in admin.list_topics(timeout=10).topics:
        spec = NewTopic(SCRATCH_TOPIC, 1, 3, config={"min.insync.replicas": "2"})
        for future in admin.create_topics([spec]).values():
            future.result(30)
    return SCRATCH_TOPIC


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_kafka_roundtrip_over_sasl_ssl(stack, scratch_topic, mechanism):
    settings = secured_settings(stack, LEASEWORK_RDKAFKA_SASL_MECHANISM=mechanism)
    common = client_config(
        settings.kafka_brokers, f"secured-{mechanism}", settings.kafka_properties
    )
    producer = Producer({**common, "acks": "all", "enable.idempotence": True})
    marker = uuid.uuid4().hex.encode()
    producer.produce(scratch_topic, marker)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {**common, "group.id": f"secured-{uuid.uuid4()}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([scratch_topic])
    seen = []
    try:
        deadline = time.monotonic() + 60  # by time: a reused stack's topic holds old markers
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                seen.append(message.value())
                if marker in seen:
                    break
    finally:
        consumer.close()
    assert marker in seen
    # every broker the cluster advertises on this listener is a secured proxy
    brokers = AdminClient(common).list_topics(timeout=10).brokers.values()
    assert sorted(f"{b.host}:{b.port}" for b in brokers) == sorted(KAFKA_SECURE_BROKERS.split(","))


def test_doctor_passes_over_the_secured_listeners_and_says_why_a_login_fails(stack, tmp_path):
    checks = doctor.run_checks(secured_settings(stack), Options())
    assert [c.name for c in checks if c.status != OK] == []
    assert {"kafka.producer", "redis.eviction", "postgres.synchronous_commit"} <= {
        c.name for c in checks
    }
    wrong = secured_settings(stack, LEASEWORK_RDKAFKA_SASL_PASSWORD="wrong")
    [kafka] = doctor.gather_kafka(wrong, Options())
    assert kafka.status == doctor.FAIL
    assert "SASL authentication error" in kafka.found and "SASL_PASSWORD" in kafka.fix
    untrusted = secured_settings(stack, LEASEWORK_RDKAFKA_SSL_CA_LOCATION=other_ca(tmp_path))
    [kafka] = doctor.gather_kafka(untrusted, Options())
    assert "certificate verify failed" in kafka.found


# --- the stack itself, secured --------------------------------------------------------------


def test_the_stack_runs_every_connection_secured(stack, client):
    if stack.layout.mode() != "secure":
        pytest.skip("the stack runs plain; `just up --secure` (just test does) runs this")
    job = client.submit("noop", {})
    wait_status(client, job["id"], {"succeeded"}, timeout=60)
    env = secured_env(stack)
    processes = ("api", "relay", "worker-1", "worker-2")
    for name in processes:
        running = read_environ(stack.pid(name)) or {}
        for key in ("LEASEWORK_REDIS_URL", "LEASEWORK_POSTGRES_DSN", "LEASEWORK_KAFKA_BROKERS"):
            assert running.get(key) == env[key], (name, key)
        assert "LEASEWORK_REDIS_ADDR" not in running
    with psycopg.connect(POSTGRES_DIRECT_DSN) as conn:
        rows = conn.execute(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s "
            "USING (pid) WHERE a.application_name = ANY(%s)",
            (list(processes),),
        ).fetchall()
    assert {name for name, _ in rows} == set(processes)
    assert all(ssl for _, ssl in rows), rows
    admin = redis.Redis(host="127.0.0.1", port=REDIS_PORT, decode_responses=True)
    on_tls = [c for c in admin.client_list() if c["laddr"].endswith(f":{REDIS_TLS_PORT}")]
    admin.close()
    # at least each worker's leases (the others connect when they first need Redis)
    assert len(on_tls) >= 2, on_tls
    assert {c["user"] for c in on_tls} == {"leasework"}
