"""Redis under Sentinel, for real: a scratch primary, replica and Sentinel
(devstack.sentinel), leasework's leases made through ``LEASEWORK_REDIS_SENTINELS``, and a
failover in the middle. The client finds the new primary by itself; fences go on rising."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from devstack.layout import HOST
from devstack.sentinel import scratch_sentinel_group
from leasework import config, redisconn
from leasework.lease import LeaseStore, lease_key


@pytest.fixture
def group(tmp_path):
    with scratch_sentinel_group(tmp_path) as group:
        yield group


def settings_for(group) -> config.Settings:
    return config.load(
        "worker",
        {
            "LEASEWORK_APP": "leasework.demo:app",
            # the host and port are the Sentinels' business; the scheme and database apply
            "LEASEWORK_REDIS_URL": "redis://unused.invalid:1/0",
            "LEASEWORK_REDIS_SENTINELS": group.sentinels,
            "LEASEWORK_REDIS_SENTINEL_MASTER": group.master_name,
        },
    )


def claim_with_retries(leases: LeaseStore, job: uuid.UUID, timeout: float = 30.0):
    """A claim, retried as the worker's claimer retries a Redis error, until it lands."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return leases.claim(job, "sentinel-test", 30.0)
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_leases_follow_the_primary_through_a_failover(group):
    client = redisconn.connect(settings_for(group).redis, timeout=2)
    leases = LeaseStore(client)
    before = leases.claim(uuid.uuid4(), "sentinel-test", 30.0)
    assert before is not None
    # replication is asynchronous: until the replica has the claim's writes, a failover may
    # lose them (fence 1 again: seen once in CI); the test is about what comes after
    assert client.execute_command("WAIT", 1, 5000) == 1, "the replica did not catch up"
    replica = redis.Redis(host=HOST, port=group.replica_port, socket_timeout=2)
    primary = redis.Redis(host=HOST, port=group.primary_port, socket_timeout=2)

    sentinel = redis.Redis(host=HOST, port=group.sentinel_port, socket_timeout=2)
    assert sentinel.sentinel_get_master_addr_by_name(group.master_name)[1] == group.primary_port
    sentinel.execute_command("SENTINEL", "FAILOVER", group.master_name)
    deadline = time.monotonic() + 30
    while sentinel.sentinel_get_master_addr_by_name(group.master_name)[1] != group.replica_port:
        assert time.monotonic() < deadline, "the Sentinel did not promote the replica"
        time.sleep(0.2)
    # until the Sentinel has turned the old primary into a replica it still takes writes, and
    # what a client writes there meanwhile is lost (the window docs/failure-modes.md names:
    # Postgres's fence condition, not Redis, keeps that from becoming a duplicate)
    while primary.info("replication")["role"] != "slave":
        assert time.monotonic() < deadline, "the old primary was not demoted"
        time.sleep(0.2)

    after = claim_with_retries(leases, uuid.uuid4())
    assert after is not None
    # it landed on the new primary (the old replica), and the fence counter went on rising
    assert replica.get(lease_key(after.job_id)) is not None
    assert after.fence > before.fence
    assert replica.info("replication")["role"] == "master"
    for c in (client, replica, primary, sentinel):
        c.close()
