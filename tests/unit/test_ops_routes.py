"""The ops endpoints (pure: a Quart test client, no server): the api's public ``/readyz``
(leasework/api/ops.py) names what is down but never echoes the dependency's error; the
internal listener's (leasework/service.py) does; ``/metrics`` can be left off the public port."""

from __future__ import annotations

from quart_trio import QuartTrio

from leasework import demo
from leasework.api.auth import Authenticator
from leasework.api.groupcommit import GroupCommit
from leasework.api.server import create_app
from leasework.config import load
from leasework.db import Database
from leasework.health import Health
from leasework.service import ops_app

ERROR = "OperationalError: connection to 10.1.2.3:5432 failed: password authentication failed"


def postgres_down() -> Health:
    health = Health()
    health.add("postgres", None)  # type: ignore[arg-type]
    health.checked.add("postgres")
    health.problems["postgres"] = ERROR
    return health


def api_app(health: Health, **env: str) -> QuartTrio:
    """The api's Quart app (behind the guard, which lets public routes through untouched)."""
    settings = load("api", {"LEASEWORK_APP": "leasework.demo:app", **env})
    db = Database("postgresql://unused@127.0.0.1:1/none", name="test")
    group = GroupCommit(db, "t")
    guard = create_app(settings, db, health, demo.app, group, auth=Authenticator(db))
    return guard.app.app


async def test_the_public_readyz_names_the_dependency_without_its_error():
    response = await api_app(postgres_down()).test_client().get("/readyz")
    body = await response.get_json()
    assert response.status_code == 503
    assert body == {
        "status": "not ready",
        "process": "api",
        "unavailable": {"postgres": "unavailable"},
    }
    assert "10.1.2.3" not in str(body)


async def test_the_internal_readyz_says_what_went_wrong():
    response = await ops_app(postgres_down(), "api").test_client().get("/readyz")
    assert response.status_code == 503
    assert (await response.get_json())["unavailable"] == {"postgres": ERROR}


async def test_a_ready_api_says_so_and_is_alive():
    client = api_app(Health()).test_client()
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert await ready.get_json() == {"status": "ready", "process": "api"}
    alive = await client.get("/healthz")
    assert await alive.get_json() == {"status": "alive", "process": "api"}


async def test_metrics_can_be_left_off_the_public_port():
    served = await api_app(Health()).test_client().get("/metrics")
    assert served.status_code == 200 and b"leasework_" in await served.get_data()
    internal = api_app(Health(), LEASEWORK_INTERNAL_ADDR="127.0.0.1:9")
    response = await internal.test_client().get("/metrics")
    assert response.status_code == 404  # the same answer as any path the api does not serve
    assert await response.get_json() == {
        "type": "https://leasework.dev/problems/not-found",
        "title": "Not found",
        "status": 404,
        "detail": "/metrics is not an endpoint; see /openapi.json",
        "instance": "/metrics",
    }
