"""The example's settings: the database is leasework's (``LEASEWORK_POSTGRES_DSN``), so an
order and its task's job commit together."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ.get("LEASEWORK_POSTGRES_DSN", "dbname=leasework"))

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "an-example-only-key-never-deploy-it")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "examples.django_shop.urls"
MIDDLEWARE: list[str] = []
INSTALLED_APPS = [
    "leasework.django",  # Django's migrate applies leasework's schema too
    "examples.django_shop.orders",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", "leasework"),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
        "CONN_MAX_AGE": 60,
    }
}
TASKS = {
    "default": {
        "BACKEND": "leasework.django.TaskBackend",
        "QUEUES": ["django-shop"],
        "OPTIONS": {
            "JOB_TYPES": {
                "examples.django_shop.orders.tasks.send_receipt": {
                    "max_attempts": 5,
                    "backoff": (1, 60),
                },
                "examples.django_shop.orders.tasks.order_total": {"runs_in": "process"},
            },
        },
    }
}
LOGGING = {"version": 1, "disable_existing_loggers": False}
