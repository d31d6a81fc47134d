"""A long-running process freezes what is alive at its start, so a full collection does not
walk the imports again; what it creates later is still collected."""

import gc
import weakref

import pytest
import trio

from leasework import cli
from leasework.heap import freeze_startup_heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_objects_alive_at_start_are_frozen_and_later_cycles_still_collected(unfrozen):
    alive = Node()
    frozen = freeze_startup_heap()
    assert frozen == gc.get_freeze_count() > 1000
    assert not any(o is alive for o in gc.get_objects())  # walked by no collection now

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None


def test_a_long_running_role_freezes_before_it_serves(unfrozen, monkeypatch):
    seen = []
    monkeypatch.setattr(trio, "run", lambda *args: seen.append(gc.get_freeze_count()))
    monkeypatch.setattr(cli, "address_taken", lambda addr: None)
    monkeypatch.delenv("LEASEWORK_APP", raising=False)
    assert cli.run_role("relay", []) == 0
    assert seen and seen[0] > 1000
