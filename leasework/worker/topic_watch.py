"""The worker's watch on the identity of the topics it consumes.

A topic deleted and made again under a running librdkafka consumer is not fetched again:
the consumer keeps the old topic's partition state (its leader epochs run ahead of the new
topic's) and stops fetching without an error, a revoke or a log line
(confluent-kafka-python#1787, confluent-kafka-javascript#274, librdkafka#3255). Kafka says
which topic a name stands for by its id, which the consumer does not expose. So the worker
asks: :class:`TopicWatch` describes its topics every ``LEASEWORK_TOPIC_CHECK_EVERY`` seconds
(10 by default, one metadata request), and each band's feed (:mod:`leasework.worker.feed`)
compares the id it subscribed under with the one seen last (:func:`recreated`); a changed
id renews the feed's consumer. A topic the cluster does not describe (deleted, not yet made
again, or the cluster unreachable) keeps its last id: nothing is renewed on a guess.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import trio
from confluent_kafka.admin import AdminClient

from leasework.config import Settings
from leasework.kafka import client_config, topic_ids
from leasework.kafka import topic_recreated as recreated

log = logging.getLogger("leasework.worker.topic_watch")

DESCRIBE_TIMEOUT = 5.0  # seconds for one describe of the topics


class TopicWatch:
    """The ids of ``topics`` as the cluster said them last (:attr:`ids`), read again every
    ``every`` seconds by :meth:`run` (None: never again after the first read)."""

    def __init__(self, settings: Settings, topics: Sequence[str], every: float | None) -> None:
        self.topics = list(dict.fromkeys(topics))
        self.every = every
        self.ids: dict[str, str] = {}
        self._admin = AdminClient(
            client_config(
                settings.kafka_brokers, f"{settings.process_name}-topics", settings.kafka_properties
            )
        )
        self._limiter = trio.CapacityLimiter(1)

    def id_of(self, topic: str) -> str | None:
        """The topic's id as last read (None: never read)."""
        return self.ids.get(topic)

    async def read(self) -> None:
        """Read the topics' ids once; a topic not described keeps the id read before."""
        # abandoned when cancelled (the stop): a describe may wait its whole timeout
        seen = await trio.to_thread.run_sync(
            topic_ids,
            self._admin,
            self.topics,
            DESCRIBE_TIMEOUT,
            limiter=self._limiter,
            abandon_on_cancel=True,
        )
        for topic, topic_id in seen.items():
            before = self.ids.get(topic)
            if recreated(before, topic_id):
                log.warning(
                    "a consumed topic was deleted and made again (its id changed): the feeds "
                    "of it renew their consumers",
                    extra={"topic": topic, "old_topic_id": before, "topic_id": topic_id},
                )
            self.ids[topic] = topic_id

    async def run(self) -> None:
        """Read the ids every ``every`` seconds, for ever (nothing at all when None)."""
        if self.every is None:
            return
        while True:
            await trio.sleep(self.every)
            await self.read()
