"""``python -m leasework.relay.lagprobe BROKERS GROUP TOPIC [EVERY]``: print where every band
of every queue stands (:func:`leasework.kafka.bands_positions`; ``GROUP`` and ``TOPIC`` are
the workers' base consumer group and ready topic) as one JSON line (:func:`sample_line`),
every ``EVERY`` seconds (once, without it), until killed. The relay exports its lag
(:mod:`leasework.relay.lag`) and judges lost records by its positions
(:mod:`leasework.relay.recovery`).

The relay runs this as a long-lived child process rather than in its own: group-offset
queries go through librdkafka's coordinator machinery, which the chaos harness saw abort the
whole process (an assertion in librdkafka) under Kafka link faults. A probe that aborts costs
a few missing lag samples and a restart of the child, not the relay. It lives as long as the
relay does, so the interpreter and librdkafka start once, not once a sample (an idle relay
used 5% of a core starting a probe every 5 s).
"""

from __future__ import annotations

import json
import os
import sys
import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from leasework.config import kafka_properties, merged_environment
from leasework.kafka import BandPositions, bands_positions, client_config


def main(argv: list[str]) -> int:
    brokers, group, topic, *every = argv
    interval = float(every[0]) if every else None
    # the relay's environment, and so its LEASEWORK_RDKAFKA_* properties (SASL, TLS)
    extra = kafka_properties(merged_environment(os.environ))
    admin = AdminClient(
        {
            **client_config(brokers.split(","), "leasework-lagprobe", extra),
            "socket.connection.setup.timeout.ms": 3000,
        }
    )
    while True:
        started = time.monotonic()
        try:
            bands = bands_positions(admin, topic, group, timeout=4.0)
            print(sample_line(bands, started), flush=True)
        except KafkaException as exc:  # one missed sample; the next may work
            print(json.dumps({"error": str(exc)[:300]}), flush=True)
        if interval is None:
            return 0
        time.sleep(interval)


def sample_line(bands: list[BandPositions], started: float) -> str:
    """One sample as a JSON line: ``{"lag": [[queue, priority, partition, lag], ...],
    "unread": [[queue, priority], ...], "bands": [{"queue", "priority", "topic", "topic_id",
    "group_read", "partitions": [[partition, low, high, committed], ...]}, ...], "started":
    monotonic seconds}``. ``unread``: bands whose group's offsets could not be read this time;
    ``started``: when the reading began (``time.monotonic()``, one clock for every process of
    the machine), so the relay knows which of its marks the sample may judge."""
    lag = [[g.queue, g.priority, g.partition, g.lag] for b in bands for g in b.lags()]
    unread = [[b.queue, b.priority] for b in bands if not b.group_read]
    described = [
        {
            "queue": b.queue,
            "priority": b.priority,
            "topic": b.topic,
            "topic_id": b.topic_id,
            "group_read": b.group_read,
            "partitions": [[p, at.low, at.high, at.committed] for p, at in b.partitions.items()],
        }
        for b in bands
    ]
    return json.dumps({"lag": lag, "unread": unread, "bands": described, "started": started})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
