"""When a lower priority band's consumer runs (leasework.worker.bands)."""

from leasework.worker.bands import OFFSET_INVALID, BandGate, caught_up_with


def opened(idle_close: float | None = 30.0, published: int = 5, at: float = 100.0) -> BandGate:
    gate = BandGate(idle_close, 0.0)
    assert gate.observe(published, at)  # the first read is a change: the band opens
    return gate


def test_a_band_closes_once_nothing_was_published_to_it_for_the_idle_time():
    gate = opened()
    assert not gate.observe(5, 110.0)
    assert not gate.may_close(129.9, unfinished=0, paused=False, caught_up=True)
    assert gate.may_close(130.0, unfinished=0, paused=False, caught_up=True)


def test_a_publish_opens_a_closed_band_and_restarts_its_idle_time():
    gate = opened()
    assert gate.may_close(130.0, 0, False, True)
    assert gate.observe(6, 131.0)  # the relay published: open it again
    assert not gate.may_close(160.0, 0, False, True)
    assert gate.may_close(161.0, 0, False, True)


def test_a_band_with_unfinished_messages_a_paused_queue_or_a_backlog_stays_open():
    gate = opened()
    assert not gate.may_close(200.0, unfinished=1, paused=False, caught_up=True)
    assert not gate.may_close(200.0, unfinished=0, paused=True, caught_up=True)
    assert not gate.may_close(200.0, unfinished=0, paused=False, caught_up=False)


def test_a_failed_read_opens_the_band_and_keeps_it_open():
    gate = opened()
    assert gate.observe(None, 150.0)
    assert not gate.may_close(170.0, 0, False, True)
    assert not gate.observe(5, 171.0)  # the count it knew: no change
    assert gate.may_close(180.0, 0, False, True)


def test_never_keeps_every_band_open():
    gate = opened(idle_close=None)
    assert not gate.may_close(1e9, 0, False, True)


def test_caught_up_needs_every_watermark_known_and_no_position_behind_it():
    assert caught_up_with([10, 7], [10, 7])
    assert caught_up_with([OFFSET_INVALID], [4])  # nothing consumed, the fetch brought nothing
    assert not caught_up_with([9, 7], [10, 7])
    assert not caught_up_with([10], [OFFSET_INVALID])  # no fetch has answered yet
    assert caught_up_with([], [])
