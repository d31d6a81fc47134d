"""A band's feed: the consumer of one queue's priority band topic and its offsets stage,
renewed when the topic is deleted and made again under it.

A librdkafka consumer does not fetch a topic made again under it (:mod:`leasework.worker.
topic_watch` says why and how the worker notices). Only a new client fetches the new topic,
so :meth:`Feed.renew` closes the consumer and subscribes a new one in the same group, between
two polls of the consume loop (:func:`leasework.worker.consumer.consume`): the offsets stage
then forgets the old consumer's offsets (its messages' jobs still run: a finish of one counts
for nothing), and the new consumer starts each partition at the new topic's log start the
first time it is assigned it (:meth:`Offsets.replace`: the group's committed offsets may be
the old topic's). What the old topic held and no worker had consumed is gone with it: the
relay's recovery publishes those jobs again (:mod:`leasework.relay.recovery`, reason
``recreated``).
"""

from __future__ import annotations

import logging
import threading

import trio
from confluent_kafka import Consumer

from leasework import metrics
from leasework.config import Settings
from leasework.kafka import client_config
from leasework.queues import DEFAULT
from leasework.queues.priorities import HIGHEST, band_consumer_group
from leasework.worker.offsets import Offsets
from leasework.worker.topic_watch import TopicWatch, recreated

log = logging.getLogger("leasework.worker.feed")

LOWER_BAND_FETCH_WAIT_MS = 3000  # a lower priority band's long poll (see consumer_config)
CLOSE_TIMEOUT = 30.0  # seconds a replaced consumer has to leave its group before it is left


def consumer_config(settings: Settings, queue: str = DEFAULT, band: int = HIGHEST) -> dict:
    """The consumer of ``queue``'s topic of priority ``band``, in the band's own group."""
    config = {
        "group.id": band_consumer_group(settings.consumer_group, queue, band),
        # offsets are stored by the worker once a job's outcome is durable, and committed
        # by librdkafka in the background (plus synchronously on revoke and shutdown)
        "enable.auto.commit": True,
        "enable.auto.offset.store": False,
        "auto.commit.interval.ms": 1000,
        # no silent jump: a partition without a usable committed offset stops with an
        # _AUTO_OFFSET_RESET event, which OffsetResets logs, counts and resumes at the log
        # start (``earliest`` did the same without a word, over records Kafka had deleted)
        "auto.offset.reset": "error",
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 2_000,
        "max.poll.interval.ms": 300_000,
        "socket.connection.setup.timeout.ms": 5_000,
        "reconnect.backoff.max.ms": 2_000,
        # an idle partition waits on the broker (long poll), not in a tight fetch loop; a
        # message that arrives ends the wait at once (fetch.min.bytes 1), so neither
        # setting costs a lone job anything: a larger fetch.min.bytes would hold it for up
        # to fetch.wait.max.ms, and batches grow by themselves under load (the relay puts a
        # pass on few partitions, leasework.relay.placement)
        "fetch.min.bytes": 1,
        "fetch.wait.max.ms": 500,
    }
    if band != HIGHEST:
        # a lower band is idle most of the time: its long polls wait longer, so that each
        # idle band costs the brokers a fetch per broker every 3 s, not every half second
        # (a message that arrives still ends the wait at once)
        config["fetch.wait.max.ms"] = LOWER_BAND_FETCH_WAIT_MS
    base = client_config(settings.kafka_brokers, settings.process_name)
    return {**base, **config, **dict(settings.kafka_properties)}


class Feed:
    """The consumer of ``topic`` (``queue``'s band ``band``) in the band's group, and its
    :class:`Offsets`. ``watch`` (None: none) says when the topic's id changed."""

    def __init__(
        self,
        settings: Settings,
        queue: str,
        band: int,
        topic: str,
        watch: TopicWatch | None = None,
    ) -> None:
        self.queue = queue
        self.band = band
        self.topic = topic
        self.watch = watch
        self.topic_id: str | None = None  # the id the consumer subscribed under, if known
        self.offsets: Offsets | None = None
        self._config = consumer_config(settings, queue, band)
        # held by the receiving thread while it uses the consumer: the stop does not wait for
        # a receive (it may wait on an unanswered read for seconds), so a close waits here
        # instead (librdkafka does not allow closing a consumer under a poll)
        self.in_use = threading.Lock()

    @classmethod
    def of(cls, offsets: Offsets, queue: str = DEFAULT, band: int = HIGHEST) -> Feed:
        """A feed of a consumer made and subscribed already, never renewed (tests)."""
        feed = cls.__new__(cls)
        feed.queue, feed.band, feed.topic, feed.watch = queue, band, offsets.topic, None
        feed.topic_id, feed.offsets, feed._config = None, offsets, {}
        feed.in_use = threading.Lock()
        return feed

    @property
    def consumer(self) -> Consumer:
        assert self.offsets is not None, "the feed is not open"
        return self.offsets.consumer

    async def open(self) -> None:
        """Make the consumer and subscribe it (the topic's id as the watch read it before)."""
        self.topic_id = self.watch.id_of(self.topic) if self.watch is not None else None
        # the offsets are the same object for ever (replace() swaps what they count), so the
        # callbacks of every consumer of the feed count alike
        self.offsets = Offsets(self._consumer(), self.topic)
        await self._subscribe(self.offsets.consumer)

    def _consumer(self) -> Consumer:
        return Consumer(self._config)

    async def _subscribe(self, consumer: Consumer) -> None:
        await trio.to_thread.run_sync(
            lambda: consumer.subscribe(
                [self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke
            )
        )

    def _on_assign(self, consumer: Consumer, partitions: list) -> None:
        if self.offsets is not None:
            self.offsets.on_assign(consumer, partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list) -> None:
        if self.offsets is not None:
            self.offsets.on_revoke(consumer, partitions)

    def stale(self) -> bool:
        """Whether the topic was deleted and made again since the consumer subscribed (a
        consumer that subscribed before its topic's id was known takes the first one read)."""
        if self.watch is None:
            return False
        seen = self.watch.id_of(self.topic)
        if self.topic_id is None:
            self.topic_id = seen
            return False
        return recreated(self.topic_id, seen)

    async def renew(self) -> None:
        """Close the consumer and subscribe a new one in its place (see the module's text).
        Call it between polls: nothing else uses the consumer meanwhile."""
        assert self.offsets is not None, "the feed is not open"
        offsets, old = self.offsets, self.offsets.consumer
        new_id = self.watch.id_of(self.topic) if self.watch is not None else None
        log.warning(
            "the topic was deleted and made again: its consumer is replaced by a new one, "
            "which starts each partition at the new topic's log start",
            extra={
                "topic": self.topic,
                "queue": self.queue,
                "priority": self.band,
                "old_topic_id": self.topic_id,
                "topic_id": new_id,
            },
        )
        async with offsets.exclusive():  # no store or commit of the old consumer's offsets
            offsets.replace(self._consumer())  # the old one's revoke on close commits nothing
            await self._close(old)
            self.topic_id = new_id
            await self._subscribe(offsets.consumer)
        metrics.consumer_renewals.labels(self.queue, str(self.band)).inc()

    async def _close(self, consumer: Consumer) -> None:
        with trio.move_on_after(CLOSE_TIMEOUT) as scope:
            await trio.to_thread.run_sync(self._close_when_free, consumer, abandon_on_cancel=True)
        if scope.cancelled_caught:
            log.warning(
                "a replaced consumer did not leave its group in time; left as it is",
                extra={"topic": self.topic, "seconds": CLOSE_TIMEOUT},
            )

    async def close(self) -> None:
        """Leave the group once no receive uses the consumer (the caller bounds how long
        that may take)."""
        if self.offsets is not None:
            await trio.to_thread.run_sync(
                self._close_when_free, self.offsets.consumer, abandon_on_cancel=True
            )

    def _close_when_free(self, consumer: Consumer) -> None:
        with self.in_use:
            consumer.close()
