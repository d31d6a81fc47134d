"""The OpenAPI operations of the public ops endpoints (:mod:`leasework.api.ops`). The document
does not describe itself: ``/openapi.json`` has no operation here."""

from __future__ import annotations


def healthz() -> dict:
    """GET ``/healthz``."""
    return {"summary": "Liveness", "responses": {"200": {"description": "alive"}}}


def readyz() -> dict:
    """GET ``/readyz``."""
    return {
        "summary": "Readiness",
        "responses": {
            "200": {"description": "ready"},
            "503": {"description": "names the unreachable dependency"},
        },
    }


def metrics() -> dict:
    """GET ``/metrics``."""
    return {
        "summary": "Prometheus metrics",
        "responses": {"200": {"description": "text format"}},
    }
