"""``INSTALLED_APPS = [..., "leasework.django"]``: Django's ``migrate`` (and so its test
databases) applies leasework's own migrations too."""

from __future__ import annotations

from django.apps import AppConfig


class LeaseworkConfig(AppConfig):
    name = "leasework.django"
    label = "leasework"
    verbose_name = "leasework"
