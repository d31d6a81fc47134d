"""A reader of ``jobs.ready`` from outside every consumer group: which partition each job's
message went to, and when the relay produced it (the message's CreateTime, set by the
relay's producer when it produced the message; milliseconds).

Entering assigns every partition at its end as it is then, so only what is published after
that is read. Direct to the brokers (not through Toxiproxy). Blocking: call from a thread.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from devstack.layout import KAFKA_DIRECT_BOOTSTRAP

TOPIC = "jobs.ready"


@dataclass(frozen=True)
class Published:
    partition: int
    produced_at: float  # epoch seconds, millisecond resolution


class ReadyTap:
    def __init__(self, bootstrap: str = KAFKA_DIRECT_BOOTSTRAP) -> None:
        self.bootstrap = bootstrap
        self.found: dict[str, Published] = {}

    def __enter__(self) -> ReadyTap:
        self.consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"leasework-tap-{uuid.uuid4()}",  # never joined: assign only
                "enable.auto.commit": False,
            }
        )
        try:
            topic = self.consumer.list_topics(TOPIC, timeout=10).topics[TOPIC]
            ends = []
            for partition in sorted(topic.partitions):
                _low, high = self.consumer.get_watermark_offsets(
                    TopicPartition(TOPIC, partition), timeout=10, cached=False
                )
                ends.append(TopicPartition(TOPIC, partition, high))
            self.consumer.assign(ends)
        except BaseException:
            self.consumer.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.consumer.close()

    def read(self, job_ids: set[str], timeout: float = 60.0) -> dict[str, Published]:
        """Where and when each of ``job_ids`` was published (their first message); raises
        TimeoutError naming how many were not seen within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not job_ids <= self.found.keys():
            if time.monotonic() > deadline:
                missing = len(job_ids - self.found.keys())
                raise TimeoutError(f"{missing} of {len(job_ids)} jobs not seen on {TOPIC}")
            for message in self.consumer.consume(500, 0.5):
                if message.error() is not None:
                    continue
                try:
                    job_id = json.loads(message.value())["job_id"]
                except (ValueError, KeyError, TypeError):
                    continue
                _kind, stamp = message.timestamp()
                self.found.setdefault(job_id, Published(message.partition(), stamp / 1000))
        return {j: self.found[j] for j in job_ids}
