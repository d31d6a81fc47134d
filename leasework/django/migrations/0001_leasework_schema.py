"""leasework's schema through Django's ``migrate``: every leasework migration not yet
applied (the same ``schema_migrations`` record and advisory lock as ``leasework migrate``,
so either may run first). Not atomic in Django's sense: each leasework migration is a
transaction of its own."""

from __future__ import annotations

from django.db import migrations


def conninfo(settings_dict: dict) -> str:
    """A libpq connection string for Django's database settings."""
    from psycopg.conninfo import make_conninfo

    options = {
        k: v for k, v in (settings_dict.get("OPTIONS") or {}).items() if isinstance(v, str | int)
    }
    params = {
        "dbname": settings_dict.get("NAME"),
        "user": settings_dict.get("USER"),
        "password": settings_dict.get("PASSWORD"),
        "host": settings_dict.get("HOST"),
        "port": settings_dict.get("PORT"),
        **options,
    }
    return make_conninfo(**{k: str(v) for k, v in params.items() if v not in (None, "")})


def apply_leasework(apps, schema_editor) -> None:
    from leasework.migrate import apply_all

    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        raise RuntimeError(
            f"leasework needs PostgreSQL; {connection.alias!r} is {connection.vendor}"
        )
    apply_all(conninfo(connection.settings_dict))


class Migration(migrations.Migration):
    atomic = False
    initial = True
    dependencies: list = []
    operations = [migrations.RunPython(apply_leasework, migrations.RunPython.noop, elidable=False)]
