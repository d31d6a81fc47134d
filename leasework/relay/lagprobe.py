"""``python -m leasework.relay.lagprobe BROKERS GROUP TOPIC [EVERY]``: print the lag of every
band of every queue (:func:`leasework.kafka.bands_lag`; ``GROUP`` and ``TOPIC`` are the
workers' base consumer group and ready topic) as one JSON line, ``{"lag": [[queue, priority,
partition, lag], ...], "unread": [[queue, priority], ...]}`` (``unread``: bands whose group
offsets could not be read this time), every ``EVERY`` seconds (once, without it), until killed.

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
from leasework.kafka import bands_lag, client_config


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
        try:
            lags, unread = bands_lag(admin, topic, group, timeout=4.0)
            sample = [[b.queue, b.priority, b.partition, b.lag] for b in lags]
            print(json.dumps({"lag": sample, "unread": unread}), flush=True)
        except KafkaException as exc:  # one missed sample; the next may work
            print(json.dumps({"error": str(exc)[:300]}), flush=True)
        if interval is None:
            return 0
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
