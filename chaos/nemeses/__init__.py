"""The fault registry, Jepsen's nemesis packages: every fault the harness can inject.

Each module of this package is one fault family and defines ``FAULTS``, its
:class:`~chaos.nemeses.base.Fault` objects (each carrying its start, its heal, its targets
and their check, its params and their random draw, what it affects and its report colour),
and ``RANK``, where the family stands in :data:`FAULTS` (the default random mix draws in that
order, so a new family takes the next rank). The registry finds the modules itself: adding a
fault is adding one module here, or one object to a family's ``FAULTS``. The scenario loader,
the random mix, the nemesis, the runner and the report all read it.

==============  =====================================================================
module          faults
==============  =====================================================================
``toxics``      latency, timeout, reset_peer, bandwidth, slicer, limit_data, link_down
``signals``     sigstop, sigkill, restart
``kafka``       kafka_kill
``redis``       redis_restart, redis_flushall
``postgres``    postgres_restart (not in the default random mix)
``queues``      queue_pause (an operator's pause; not in the default random mix)
``records``     records_delete, topic_recreate, offsets_reset, retention_shrink (Kafka
                forgets records a waiting job needs; not in the default random mix)
==============  =====================================================================

:data:`RANDOM_MIX` is what a ``[random_faults]`` table draws from when it names no faults:
every fault but those added after the seeded schedules of existing scenarios were chosen
(``random_mix=False``), whose draws would otherwise change.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType

from chaos.nemeses.base import Fault

_NOT_FAMILIES = frozenset({"base"})


def _discover() -> dict[str, Fault]:
    modules = [
        importlib.import_module(f"{__name__}.{info.name}")
        for info in pkgutil.iter_modules(__path__)
        if info.name not in _NOT_FAMILIES and not info.name.startswith("_")
    ]
    registry: dict[str, Fault] = {}
    for module in sorted(modules, key=lambda m: (m.RANK, m.__name__)):
        for fault in module.FAULTS:
            if fault.name in registry:
                raise RuntimeError(f"fault {fault.name!r} is defined twice ({module.__name__})")
            registry[fault.name] = fault
    return registry


REGISTRY: Mapping[str, Fault] = MappingProxyType(_discover())
FAULTS: tuple[str, ...] = tuple(REGISTRY)  # every fault's name, family by family
# the faults the random mix draws from by default, in the same order
RANDOM_MIX: tuple[str, ...] = tuple(name for name, f in REGISTRY.items() if f.random_mix)


def lookup(name: str) -> Fault:
    """The fault named ``name``; ValueError naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}") from None
