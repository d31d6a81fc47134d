"""Versioned SQL migrations, applied once each, serialised by a Postgres advisory lock.

Files ``migrations/NNNN_name.sql`` are applied in order, each in its own transaction with its
row in ``schema_migrations``. Concurrent runs queue on the advisory lock; the second finds
nothing left to do. Migrations never run at service start-up: schema changes have one owner.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from importlib import resources

import psycopg

log = logging.getLogger("leasework.migrate")

# an arbitrary constant: every migrate run takes this advisory lock
MIGRATION_LOCK_ID = 0x1EA5E_0001


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def discover() -> list[Migration]:
    found = []
    for entry in resources.files("leasework.migrations").iterdir():
        if entry.name.endswith(".sql"):
            version, _, rest = entry.name.partition("_")
            found.append(Migration(int(version), rest.removesuffix(".sql"), entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a version number: {versions}")
    return found


def apply_all(dsn: str) -> list[int]:
    """Apply every pending migration; return the versions applied by this run."""
    applied: list[int] = []
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_ID,))
        try:
            conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            done = {
                version: checksum
                for version, checksum in conn.execute(
                    "SELECT version, checksum FROM schema_migrations"
                )
            }
            for migration in discover():
                if migration.version in done:
                    if done[migration.version] != migration.checksum:
                        log.warning(
                            "migration changed after it was applied",
                            extra={"version": migration.version, "migration": migration.name},
                        )
                    continue
                with conn.transaction():
                    conn.execute(migration.sql)
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) "
                        "VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
                log.info("applied migration", extra={"version": migration.version})
                applied.append(migration.version)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_ID,))
    return applied
