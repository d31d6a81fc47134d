"""The settings that reach the stack's secured listeners (devstack.tls), for the tests that run
a dependency's connection secured."""

from __future__ import annotations

from devstack import Stack
from devstack.tls import secure_env
from leasework import config


def secured_env(stack: Stack) -> dict[str, str]:
    return secure_env(stack.layout.tls_dir)


def secured_settings(stack: Stack, role: str = "doctor", **overrides: str) -> config.Settings:
    """What a leasework process in secure mode runs with: Postgres verify-full, Redis over TLS
    as the ACL user, Kafka SASL_SSL with SCRAM-SHA-512, all through their proxies."""
    return config.load(role, {**secured_env(stack), **overrides})
