"""The ops endpoints (pure: a Quart test client, no server): the api's public ``/readyz``
names what is down but never echoes the dependency's error; the internal one does."""

from __future__ import annotations

from quart_trio import QuartTrio

from leasework.health import Health
from leasework.service import add_ops_routes

ERROR = "OperationalError: connection to 10.1.2.3:5432 failed: password authentication failed"


async def readyz(detail: bool, metrics: bool = True) -> tuple[int, dict, int]:
    app = QuartTrio("t", static_folder=None)
    health = Health()
    health.add("postgres", None)  # type: ignore[arg-type]
    health.checked.add("postgres")
    health.problems["postgres"] = ERROR
    add_ops_routes(app, health, "api", detail=detail, metrics=metrics)
    client = app.test_client()
    response = await client.get("/readyz")
    metrics_status = (await client.get("/metrics")).status_code
    return response.status_code, await response.get_json(), metrics_status


async def test_the_public_readyz_names_the_dependency_without_its_error():
    status, body, _ = await readyz(detail=False)
    assert status == 503 and body["unavailable"] == {"postgres": "unavailable"}
    assert "10.1.2.3" not in str(body)


async def test_the_internal_readyz_says_what_went_wrong():
    status, body, _ = await readyz(detail=True)
    assert status == 503 and body["unavailable"] == {"postgres": ERROR}


async def test_metrics_can_be_left_off_the_public_port():
    assert (await readyz(detail=False, metrics=False))[2] == 404
    assert (await readyz(detail=False, metrics=True))[2] == 200
