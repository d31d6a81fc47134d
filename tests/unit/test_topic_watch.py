"""The worker's watch on its topics' ids and a feed's verdict on them, without Kafka."""

from __future__ import annotations

import pytest

from leasework.worker.feed import Feed
from leasework.worker.offsets import Offsets
from leasework.worker.topic_watch import recreated


@pytest.mark.parametrize(
    ("known", "seen", "verdict"),
    [
        ("a", "a", False),
        ("a", "b", True),  # deleted and made again
        ("a", None, False),  # not described this time (deleted, not yet made again): no guess
        (None, "b", False),  # nothing to compare with
        (None, None, False),
    ],
)
def test_a_topic_is_recreated_only_when_both_ids_are_known_and_differ(known, seen, verdict):
    assert recreated(known, seen) is verdict


class Watch:
    def __init__(self) -> None:
        self.ids: dict[str, str] = {}

    def id_of(self, topic: str) -> str | None:
        return self.ids.get(topic)


def test_a_feed_is_stale_once_its_topic_id_changes_and_takes_a_first_id_it_lacked():
    feed = Feed.of(Offsets(None, "jobs.ready"))  # type: ignore[arg-type]
    assert not feed.stale()  # no watch: never
    feed.watch = watch = Watch()  # type: ignore[assignment]
    assert not feed.stale()  # no id known yet on either side
    watch.ids["jobs.ready"] = "id-1"
    assert not feed.stale() and feed.topic_id == "id-1"  # subscribed before it was read
    watch.ids["jobs.other"] = "id-9"
    assert not feed.stale()  # another topic's id
    watch.ids["jobs.ready"] = "id-2"
    assert feed.stale()
