"""The relay process: one maintenance service per module (outbox, promoter, reaper, pruner,
backlog, lag), each with a small config, ``run_once()`` returning what it did and ``run()``
looping with its own backoff (:mod:`leasework.relay.service`); :mod:`leasework.relay.process`
runs them in one nursery."""

from leasework.relay.backlog import outbox_gauge_loop
from leasework.relay.process import run

__all__ = ["outbox_gauge_loop", "run"]
