"""Local-stack supervisor for leasework: postgres, redis, toxiproxy, 3 Kafka nodes,
prometheus and the leasework processes, on loopback. See ``python -m devstack -h``.

>>> from devstack import Stack
>>> stack = Stack.from_env(); stack.up(apps=False)
"""

from .errors import StackError
from .layout import Layout
from .stack import Stack
from .status import ServiceStatus

__all__ = ["Layout", "ServiceStatus", "Stack", "StackError"]
