"""``python -m leasework.relay.lagprobe BROKERS GROUP TOPIC [EVERY]``: print the group's lag per
partition as one JSON line, every ``EVERY`` seconds (once, without it), until killed.

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

from confluent_kafka import Consumer, KafkaException

from leasework.config import kafka_properties, merged_environment
from leasework.kafka import client_config, group_lag


def main(argv: list[str]) -> int:
    brokers, group, topic, *every = argv
    interval = float(every[0]) if every else None
    # the relay's environment, and so its LEASEWORK_RDKAFKA_* properties (SASL, TLS)
    extra = kafka_properties(merged_environment(os.environ))
    probe = Consumer(
        {
            **client_config(brokers.split(","), "leasework-lagprobe", extra),
            "group.id": group,  # reads the group's committed offsets; never subscribes
            "enable.auto.commit": False,
            "socket.connection.setup.timeout.ms": 3000,
        }
    )
    try:
        while True:
            try:
                print(json.dumps(group_lag(probe, topic, timeout=4.0)), flush=True)
            except KafkaException as exc:  # one missed sample; the next may work
                print(json.dumps({"error": str(exc)[:300]}), flush=True)
            if interval is None:
                return 0
            time.sleep(interval)
    finally:
        probe.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
