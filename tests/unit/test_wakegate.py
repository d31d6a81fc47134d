"""The wake gates' constants: the outbox trigger (migration 0020) and the listeners
(leasework/wakegate.py) must name the same lock classes and stripes, or a waiting listener
would hold locks no inserter tries, and hear nothing."""

from __future__ import annotations

import re
from pathlib import Path

from leasework import wakegate
from leasework.relay.outbox import NOTIFY_CHANNEL
from leasework.worker.wakeup import CHANNEL as READY_CHANNEL

MIGRATIONS = Path(wakegate.__file__).parent / "migrations"


def latest_outbox_notify() -> str:
    """The body of the last migration that (re)defines ``outbox_notify()``."""
    defining = [
        path
        for path in sorted(MIGRATIONS.glob("*.sql"))
        if "FUNCTION outbox_notify()" in path.read_text()
    ]
    return defining[-1].read_text()


def test_the_trigger_tries_each_channels_gate_on_the_listeners_stripes():
    sql = latest_outbox_notify()
    assert f"pg_backend_pid() % {wakegate.STRIPES};" in sql
    tried = re.findall(r"IF NOT pg_try_advisory_xact_lock\((\d+), stripe\) THEN\s+(.*?)\n", sql)
    gates = {int(gate): body for gate, body in tried}
    assert f"pg_notify('{NOTIFY_CHANNEL}'" in gates[wakegate.RELAY_GATE]
    assert set(gates) == {wakegate.RELAY_GATE, wakegate.WORKER_GATE}
    # the worker gate's branch is the one that sends the wake-up
    worker_branch = sql.split(f"pg_try_advisory_xact_lock({wakegate.WORKER_GATE}, stripe)")[1]
    assert f"pg_notify('{READY_CHANNEL}'" in worker_branch


def test_the_gates_are_lock_classes_of_their_own():
    from leasework.queues import LIMIT_LOCK, PAUSE_LOCK

    classes = [wakegate.RELAY_GATE, wakegate.WORKER_GATE, PAUSE_LOCK[0], LIMIT_LOCK]
    assert len(set(classes)) == len(classes)
    assert wakegate.all_stripes() == frozenset(range(wakegate.STRIPES))
