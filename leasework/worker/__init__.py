"""The worker process: a message passes through consume, claim, execute, complete and
offsets once, in that order (see :mod:`leasework.worker.process`, which wires the stages)."""

from leasework.worker.process import Worker

__all__ = ["Worker"]
