"""The supervised services, in start order; the extra relays last (started on demand only)."""

from __future__ import annotations

from ..layout import APPS, EXTRA_RELAYS, KAFKA_NODE_IDS, Layout
from .alertmanager import Alertmanager
from .apps import ExampleShop, LeaseworkApp
from .base import Service
from .kafka import KafkaNode
from .postgres import Postgres
from .prometheus import Prometheus
from .redis import Redis
from .toxiproxy import Toxiproxy

__all__ = ["Service", "build_services"]


def build_services(layout: Layout) -> dict[str, Service]:
    """name -> Service for the whole stack, infrastructure first, in start order."""
    services: list[Service] = [Postgres(layout), Redis(layout), Toxiproxy(layout)]
    services += [KafkaNode(layout, n) for n in KAFKA_NODE_IDS]
    # Alertmanager first: the Prometheus started next sends to it from its first alert on
    services += [Alertmanager(layout), Prometheus(layout)]
    services += [LeaseworkApp(layout, name) for name in APPS]
    services.append(ExampleShop(layout))
    # started only when a chaos scenario asks for them (kind "extra"; `up` leaves them alone)
    services += [LeaseworkApp(layout, name) for name in EXTRA_RELAYS]
    return {s.name: s for s in services}
