"""The lease scripts against the real Redis (through its Toxiproxy proxy), each once over the
plain port and once over TLS as the stack's ACL user (devstack.tls)."""

from __future__ import annotations

import time
import uuid

import pytest

from devstack.layout import REDIS_PROXY_PORT
from leasework import redisconn
from leasework.lease import FENCE_KEY, LeaseStore, lease_key
from tests.integration.secured import secured_settings


@pytest.fixture(params=["plain", "tls-acl"])
def leases(request, stack):
    if request.param == "plain":
        target = redisconn.RedisTarget(f"redis://127.0.0.1:{REDIS_PROXY_PORT}/0")
    else:
        target = secured_settings(stack).redis
    client = redisconn.connect(target, timeout=5)
    yield LeaseStore(client)
    client.close()


def test_claim_is_exclusive_and_fences_increase(leases):
    job = uuid.uuid4()
    first = leases.claim(job, "w1", 5.0)
    assert first is not None
    assert leases.claim(job, "w2", 5.0) is None
    other = leases.claim(uuid.uuid4(), "w2", 5.0)
    assert other.fence > first.fence
    assert leases.release(first) and leases.release(other)


def test_renew_and_release_only_with_the_current_token(leases):
    job = uuid.uuid4()
    claim = leases.claim(job, "w1", 5.0)
    leases.release(claim)
    newer = leases.claim(job, "w2", 5.0)
    assert not leases.renew(claim, 5.0)  # an old holder cannot extend the new lease
    assert not leases.release(claim)  # nor delete it
    assert leases.client.get(lease_key(job)) is not None
    assert leases.renew(newer, 5.0) and leases.release(newer)


def test_lease_expires_by_itself(leases):
    job = uuid.uuid4()
    claim = leases.claim(job, "w1", 0.3)
    deadline = time.monotonic() + 5
    while leases.client.exists(lease_key(job)) and time.monotonic() < deadline:
        time.sleep(0.05)
    again = leases.claim(job, "w2", 5.0)
    assert again is not None and again.fence > claim.fence
    leases.release(again)


def test_reseed_only_moves_the_counter_up(leases):
    current = int(leases.client.get(FENCE_KEY) or 0)
    assert leases.reseed(current - 1) >= current  # never down
    floor = current + 1000
    assert leases.reseed(floor) >= floor
    assert leases.claim(uuid.uuid4(), "w", 1.0).fence > floor
